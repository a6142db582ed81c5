/**
 * jupyter-traincontrol's JupyterLab / Notebook 7 extension: a "Training runs"
 * side panel, a status bar item and palette commands, all talking to runs
 * through the server extension (registry records and FIFOs), so they work
 * whatever the kernels are doing.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { Command, IRun } from './api';
import { confirmCommand } from './confirm';
import { RunsModel } from './model';
import { NotebookPanelButtons } from './notebookButtons';
import { loadVocabulary } from './vocabulary';
import { PANEL_ID, RunsPanel } from './panel';
import { RunPlaces } from './runPlaces';
import { RunsStatus } from './status';

namespace CommandIDs {
  export const open = 'traincontrol:open-panel';
  export const stopAll = 'traincontrol:stop-all';
  export const saveAll = 'traincontrol:save-all';
}

const runsIcon = new LabIcon({
  name: 'jupyter-traincontrol:runs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M3 3h2v16h16v2H3z"/>' +
    '<path d="M6.3 6.7 7.7 5.3l4.3 4.9 3-2.2 5.7 6.6-1.5 1.3-4.5-5.2-3 2.2z"/>' +
    '</g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-traincontrol:plugin',
  description:
    'A side panel and status bar item to stop, save, abort, pause and resume Keras training runs.',
  autoStart: true,
  optional: [ICommandPalette, IMainMenu, IStatusBar, ILayoutRestorer, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    statusBar: IStatusBar | null,
    restorer: ILayoutRestorer | null,
    rendermime: IRenderMimeRegistry | null
  ) => {
    const model = new RunsModel();
    // Help texts and which commands apply in which state, from the server's one table.
    loadVocabulary().catch(error => console.warn('jupyter-traincontrol: no command vocabulary', error));
    // The notebook panel's buttons: straight to the server, whatever the kernel does.
    new NotebookPanelButtons(app, model);
    // Where a notebook panel's widgets are gone (a kernel restart), the run as the server records it.
    const sendConfirmed = async (run: IRun, command: Command | string): Promise<string> =>
      (await confirmCommand(run.name, command)) ? model.send(run.name, command) : '';
    new RunPlaces(app, model, rendermime, sendConfirmed);
    const panel = new RunsPanel(model);
    panel.title.icon = runsIcon;
    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, 'jupyter-traincontrol');

    const { commands } = app;
    commands.addCommand(CommandIDs.open, {
      label: 'Training Runs',
      caption: 'Show the training runs of this user',
      icon: runsIcon,
      execute: () => app.shell.activateById(PANEL_ID)
    });
    const sendToAll = (command: Command, verb: string) => async () => {
      const { sent, failed } = await model.sendToAll(command);
      if (sent.length === 0 && failed.length === 0) {
        Notification.info(`No active training run to ${verb}.`, { autoClose: 4000 });
        return;
      }
      if (sent.length) {
        Notification.success(`Sent ${command} to ${sent.join(', ')}.`, { autoClose: 4000 });
      }
      for (const { name, message } of failed) {
        Notification.error(`Could not send ${command} to ${name}: ${message}`, { autoClose: 8000 });
      }
    };
    commands.addCommand(CommandIDs.stopAll, {
      label: 'Stop All Training Runs',
      caption: 'Checkpoint, then end every active run gracefully',
      execute: sendToAll('stop', 'stop')
    });
    commands.addCommand(CommandIDs.saveAll, {
      label: 'Save All Training Runs',
      caption: 'Write a checkpoint of every active run now; training goes on',
      execute: sendToAll('save', 'save')
    });

    const category = 'Training';
    for (const command of [CommandIDs.open, CommandIDs.stopAll, CommandIDs.saveAll]) {
      palette?.addItem({ command, category });
    }
    mainMenu?.viewMenu.addGroup([{ command: CommandIDs.open }], 100);

    if (statusBar) {
      const item = new RunsStatus(model, () => {
        void commands.execute(CommandIDs.open);
      });
      statusBar.registerStatusItem('jupyter-traincontrol:status', {
        item,
        align: 'left',
        rank: 100,
        isActive: () => item.hasActiveRuns,
        activeStateChanged: model.changed
      });
    }
  }
};

export default plugin;
