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
 * Abort and Rollback ask first, in a dialog, as the side panel's do (the
 * widget's own confirm step, "Confirm abort", needs the kernel). The learning-rate field (`traincontrol-field
 * traincontrol-command-set traincontrol-tunable-learning_rate`, an
 * ipywidgets Text) is handled the same way: Enter posts ``set lr=VALUE``,
 * and the widget's own sync of that value is held back, so it is sent once.
 *
 * Where the server does not list the run, or the request fails, the click
 * is replayed to the widget: the comm carries it, as without this extension.
 * Panels whose clicks go to the server get the class `traincontrol-direct`,
 * which hides the panel's "clicks here wait" notice.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { Command, sendCommand } from './api';
import { asksFirst, confirmCommand } from './confirm';
import { isActive, RunsModel } from './model';

const COMMANDS: Command[] = ['stop', 'save', 'abort', 'pause', 'resume', 'rollback'];
const LR_FIELD = '.traincontrol-field.traincontrol-tunable-learning_rate input';
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
    document.addEventListener('keydown', this._onKey, true);
    document.addEventListener('change', this._onChange, true);
    model.changed.connect(this._markPanels, this);
  }

  dispose(): void {
    document.removeEventListener('click', this._onClick, true);
    document.removeEventListener('keydown', this._onKey, true);
    document.removeEventListener('change', this._onChange, true);
    this.model.changed.disconnect(this._markPanels, this);
  }

  /**
   * True if the server extension answers and lists `name` as active, or not
   * at all: then clicks go to the server. A run too new to be listed yet is
   * tried too; the server's 404 then sends the click back to the comm. (The
   * history may list ended runs of the same name beside an active one.)
   */
  private _serves(name: string): boolean {
    const { model } = this;
    if (!model.loaded || model.error !== null) {
      return false;
    }
    const named = model.runs.filter(run => run.name === name);
    return named.length === 0 || named.some(isActive);
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
    // The widget's own "Confirm abort" (armed by a click the comm carried) has asked already.
    if (asksFirst(command) && !button.textContent?.trim().startsWith('Confirm')) {
      void this._confirmThenSend(panel, button, name, command);
      return;
    }
    void this._send(panel, button, name, command);
  };

  private async _confirmThenSend(panel: Element, button: HTMLButtonElement, name: string, command: Command): Promise<void> {
    if (await confirmCommand(name, command)) {
      await this._send(panel, button, name, command);
    }
  }

  /** The run whose learning-rate field `target` is, if its edits go to the server. */
  private _lrField(target: EventTarget | null): { input: HTMLInputElement; panel: Element; name: string } | null {
    const input = (target as Element | null)?.closest?.(LR_FIELD) as HTMLInputElement | null;
    const panel = input?.closest('.traincontrol-panel');
    const name = panel ? classValue(panel, RUN_PREFIX) : null;
    if (!input || !panel || !name || !this._serves(name) || this._fellBack.has(name)) {
      return null;
    }
    return { input, panel, name };
  }

  /** Enter in a panel's learning-rate field: `set lr=VALUE` through the server. */
  private _onKey = (event: KeyboardEvent): void => {
    if (event.key !== 'Enter') {
      return;
    }
    const field = this._lrField(event.target);
    if (!field) {
      return; // the widget syncs its value through the comm
    }
    event.stopImmediatePropagation();
    event.preventDefault();
    void this._setLearningRate(field.input, field.name);
  };

  /** Holds back the widget's own sync of the field (on Enter or blur) while edits go to the server. */
  private _onChange = (event: Event): void => {
    if (this._lrField(event.target)) {
      event.stopImmediatePropagation();
    }
  };

  private async _setLearningRate(input: HTMLInputElement, name: string): Promise<void> {
    const value = input.value.trim();
    if (!value) {
      return;
    }
    input.classList.add('traincontrol-sending');
    try {
      await sendCommand(name, `set lr=${value}`, 'notebook-panel');
      input.classList.add('traincontrol-sent');
      window.setTimeout(() => input.classList.remove('traincontrol-sent'), 1200);
      void this.model.refresh();
    } catch (error) {
      // A value the server refuses (400) is the user's to fix: say why, send nothing.
      Notification.error(
        `Could not set the learning rate of ${name} to ${value}: ${error instanceof Error ? error.message : error}`,
        { autoClose: 8000 }
      );
    } finally {
      input.classList.remove('traincontrol-sending');
    }
  }

  private async _send(panel: Element, button: HTMLButtonElement, name: string, command: Command): Promise<void> {
    button.classList.add('traincontrol-sending');
    try {
      await sendCommand(name, command, 'notebook-panel');
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
