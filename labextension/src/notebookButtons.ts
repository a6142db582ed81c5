/**
 * A front-end path for the buttons of the notebook panel (`ControlPanel`,
 * an ipywidgets box in a cell's output).
 *
 * Widget clicks travel as comm messages, which a kernel busy with a cell
 * reads only when that cell ends (ipywidgets #3468). The Python panel marks
 * its widgets with classes: the box `traincontrol-panel` and
 * `traincontrol-run-<name>`, each button `traincontrol-button` and
 * `traincontrol-command-<command>`. A capturing click listener sends a click
 * on such a button to the server's commands endpoint instead (the run's
 * FIFO, at once, whatever the kernel does) and stops the event before the
 * widget view sees it, so the comm never also sends it.
 *
 * Where the server does not list the run, or the request fails, the click
 * is replayed to the widget: the comm carries it, as without this extension.
 * Panels whose clicks go to the server get the class `traincontrol-direct`,
 * which hides the panel's "clicks here wait" notice.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { Command, sendCommand } from './api';
import { isActive, RunsModel } from './model';

const COMMANDS: Command[] = ['stop', 'save', 'abort', 'pause', 'resume'];
const RUN_PREFIX = 'traincontrol-run-';
const COMMAND_PREFIX = 'traincontrol-command-';
/** Set on a panel whose clicks go to the server. */
export const DIRECT_CLASS = 'traincontrol-direct';

function classValue(element: Element, prefix: string): string | null {
  for (const name of Array.from(element.classList)) {
    if (name.startsWith(prefix) && name.length > prefix.length) {
      return name.slice(prefix.length);
    }
  }
  return null;
}

/** The command a panel button stands for (Pause reads Resume when paused). */
export function buttonCommand(button: Element): Command | null {
  const command = classValue(button, COMMAND_PREFIX) as Command | null;
  if (command === 'pause' && button.textContent?.trim() === 'Resume') {
    return 'resume';
  }
  return command && COMMANDS.includes(command) ? command : null;
}

export class NotebookPanelButtons {
  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly model: RunsModel
  ) {
    document.addEventListener('click', this._onClick, true);
    model.changed.connect(this._markPanels, this);
  }

  dispose(): void {
    document.removeEventListener('click', this._onClick, true);
    this.model.changed.disconnect(this._markPanels, this);
  }

  /**
   * True if the server extension answers and does not list `name` as ended:
   * then clicks go to the server. A run too new to be listed yet is tried
   * too; the server's 404 then sends the click back to the comm.
   */
  private _serves(name: string): boolean {
    const { model } = this;
    return (
      model.loaded &&
      model.error === null &&
      !model.runs.some(run => run.name === name && !isActive(run))
    );
  }

  /** Marks the panels whose clicks go to the server (after each poll). */
  private _markPanels(): void {
    for (const panel of Array.from(document.querySelectorAll('.traincontrol-panel'))) {
      const name = classValue(panel, RUN_PREFIX);
      panel.classList.toggle(DIRECT_CLASS, name !== null && this._serves(name) && !this._fellBack.has(name));
    }
  }

  private _onClick = (event: MouseEvent): void => {
    const target = event.target as Element | null;
    const button = target?.closest?.('button.traincontrol-button') as HTMLButtonElement | null;
    if (!button || button.disabled) {
      return;
    }
    if (this._replaying.has(button)) {
      this._replaying.delete(button); // our own replay: let the widget have it
      return;
    }
    const panel = button.closest('.traincontrol-panel');
    const name = panel ? classValue(panel, RUN_PREFIX) : null;
    const command = buttonCommand(button);
    if (!panel || !name || !command || !this._serves(name)) {
      return; // the comm carries it
    }
    event.stopImmediatePropagation();
    event.preventDefault();
    void this._send(panel, button, name, command);
  };

  private async _send(panel: Element, button: HTMLButtonElement, name: string, command: Command): Promise<void> {
    button.classList.add('traincontrol-sending');
    try {
      await sendCommand(name, command);
      this._fellBack.delete(name);
      button.classList.add('traincontrol-sent');
      window.setTimeout(() => button.classList.remove('traincontrol-sent'), 1200);
      void this.model.refresh();
    } catch (error) {
      // Let the comm carry it, and show the panel's own notice if it will wait.
      this._fellBack.add(name);
      panel.classList.remove(DIRECT_CLASS);
      const busy = this._kernelStatus(panel) === 'busy';
      Notification.warning(
        `Could not send ${command} to ${name} through the server (${error instanceof Error ? error.message : error}); ` +
          (busy ? 'sent through the kernel, which is busy: it acts when the running cell ends.' : 'sent through the kernel.'),
        { autoClose: 8000 }
      );
      this._replaying.add(button);
      button.click();
    } finally {
      button.classList.remove('traincontrol-sending');
    }
  }

  /** The status of the kernel of the notebook (or console) holding `node`. */
  private _kernelStatus(node: Element): string | null {
    for (const widget of Array.from(this.app.shell.widgets('main'))) {
      if (widget.node.contains(node)) {
        const context = (widget as any).sessionContext;
        return context?.session?.kernel?.status ?? null;
      }
    }
    return null;
  }

  private _replaying = new WeakSet<HTMLButtonElement>();
  private _fellBack = new Set<string>();
}
