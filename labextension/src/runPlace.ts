/**
 * `RunPlace`: a run shown where its notebook panel was, when the panel's
 * widgets cannot show it any more.
 *
 * Widgets live only as long as their kernel: after a kernel restart the
 * panel stays at its last state under ipywidgets' broken-link icons, and in
 * a notebook reopened later (or after a server restart) ipywidgets says
 * "model not found". The cell's output also names the run, in the mime type
 * `RUN_MIME_TYPE` (`{"name", "run_id", "checkpoint_dir"}`, written by the
 * kernel beside the widget view). A `RunPlace` shows that run as the server
 * records it: how it ended, where, and its checkpoints; an active run with
 * its buttons, which go through the server.
 */
import { Widget } from '@lumino/widgets';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { IRun } from './api';
import { CommandHandler, RunCard } from './card';
import { text } from './chart';
import { setBreakablePath } from './format';
import { findRun, isActive, RunsModel } from './model';

/** The mime type by which a cell's output names its run. */
export const RUN_MIME_TYPE = 'application/vnd.jupyter-traincontrol.run+json';

/** What an output says of its run. */
export interface IRunRef {
  name: string;
  run_id?: string | null;
  checkpoint_dir?: string | null;
}

/** The run an output's mime data names, or null if the data is not one. */
export function runRef(data: unknown): IRunRef | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const { name, run_id, checkpoint_dir } = data as { [key: string]: unknown };
  if (typeof name !== 'string' || name === '') {
    return null;
  }
  return {
    name,
    run_id: typeof run_id === 'string' ? run_id : null,
    checkpoint_dir: typeof checkpoint_dir === 'string' ? checkpoint_dir : null
  };
}

export class RunPlace extends Widget implements IRenderMime.IRenderer {
  /**
   * @param model - The runs, as the server lists them.
   * @param onCommand - Sends a command (asking first where it should).
   * @param why - Why the panel's widgets do not show the run: a sentence.
   */
  constructor(
    private readonly model: RunsModel,
    onCommand: CommandHandler,
    private why = ''
  ) {
    super();
    this.addClass('jp-TrainControl-place');
    this.addClass('jp-OutputArea-output');
    this._card = new RunCard(onCommand);
    this._note = text('div', 'jp-TrainControl-placeNote', '');
    model.changed.connect(this._render, this);
  }

  /** The run shown. */
  get ref(): IRunRef | null {
    return this._ref;
  }

  /** Shows the run `ref` names (as a renderer, `renderModel` calls it). */
  showRun(ref: IRunRef, why?: string): void {
    this._ref = ref;
    if (why !== undefined) {
      this.why = why;
    }
    this.node.dataset.run = ref.name;
    this._render();
  }

  async renderModel(mimeModel: IRenderMime.IMimeModel): Promise<void> {
    const ref = runRef(mimeModel.data[RUN_MIME_TYPE]);
    if (ref) {
      this.showRun(ref, mimeModel.trusted ? '' : 'This output is not trusted, so its widgets are not shown.');
    }
  }

  dispose(): void {
    if (!this.isDisposed) {
      this.model.changed.disconnect(this._render, this);
    }
    super.dispose();
  }

  private _render(): void {
    const ref = this._ref;
    if (!ref) {
      return;
    }
    const run = findRun(this.model.runs, ref);
    if (run) {
      this._card.update(run, Date.now() / 1000);
      this._note.textContent = this._noteFor(run);
      this._show(this._card.node, this._note);
      return;
    }
    // Not listed: the server's history has let it go, or the server cannot be asked.
    const head = text('div', 'jp-TrainControl-runHead', '');
    head.append(text('span', 'jp-TrainControl-runName', ref.name));
    const body = document.createElement('div');
    body.className = 'jp-TrainControl-run jp-mod-ended jp-mod-unlisted';
    body.dataset.run = ref.name;
    const error = this.model.error;
    const why = !this.model.loaded
      ? 'Looking for this run on the server…'
      : error
        ? `Cannot ask the server about this run: ${error.message}`
        : 'The server lists no such run any more: its history keeps ended runs for 7 days (the last 50, 5 of one name).';
    body.append(head, text('div', 'jp-TrainControl-outcomeText', why));
    if (ref.checkpoint_dir) {
      // What the folder holds now is not known here (a run that wrote none left none).
      const folder = text('div', 'jp-TrainControl-checkpointLabel', 'checkpoints, if it wrote any, in ');
      const path = text('span', 'jp-TrainControl-checkpointDir', '');
      setBreakablePath(path, ref.checkpoint_dir);
      folder.appendChild(path);
      body.appendChild(folder);
    }
    this._note.textContent = this.why;
    this._show(body, this._note);
  }

  private _noteFor(run: IRun): string {
    const source = isActive(run)
      ? 'The run goes on; its buttons here act through the server.'
      : 'This is the run as the server recorded it (also in the Training runs side panel).';
    return [this.why, source].filter(Boolean).join(' ');
  }

  private _show(...nodes: HTMLElement[]): void {
    const current = Array.from(this.node.children);
    if (current.length !== nodes.length || current.some((node, i) => node !== nodes[i])) {
      this.node.replaceChildren(...nodes);
    }
  }

  private _ref: IRunRef | null = null;
  private _card: RunCard;
  private _note: HTMLElement;
}
