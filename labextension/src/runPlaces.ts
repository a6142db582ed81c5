/**
 * `RunPlaces`: where a notebook panel's widgets no longer show their run
 * (its kernel restarted, or the notebook was reopened with another kernel),
 * shows a `RunPlace` in that output instead: the run as the server records
 * it.
 *
 * Once a second it looks at the outputs of the open notebooks that name a
 * run (`RUN_MIME_TYPE`). An output whose panel is live (a
 * `.traincontrol-panel` view, not marked `jupyter-widgets-disconnected`) is
 * left alone. One whose widgets are disconnected (a kernel restart), or that
 * shows no panel for a few seconds ("model not found"), gets a `RunPlace`
 * beside its hidden widget view; if the panel comes back (its widgets were
 * only late), the place goes.
 *
 * Where the widget renderer is not used at all (an untrusted output), the
 * mime type's own renderer (`runPlaceFactory`) shows the place.
 *
 * Notebooks are found through the shell's main area and read by their
 * shape (`content.widgets`, `outputArea.model`), so the extension needs no
 * notebook packages, and the same code serves JupyterLab and Notebook 7.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, Widget } from '@lumino/widgets';

import { CommandHandler } from './card';
import { RunsModel } from './model';
import { IRunRef, RUN_MIME_TYPE, RunPlace, runRef } from './runPlace';

/** After the widget renderer stops showing a panel, this long passes before the place shows (widgets can be late). */
const GRACE_MS = 3000;
const SCAN_MS = 1000;
/** After the widget view: the rendermime rank of the run's own renderer (the widget view's is -10). */
const RANK = 50;
/** On a widget view that a place stands in for. */
const HIDDEN_CLASS = 'jp-TrainControl-replaced';

/** The mime type's renderer: for outputs whose widget view is not rendered (untrusted ones). */
export function runPlaceFactory(model: RunsModel, onCommand: CommandHandler): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [RUN_MIME_TYPE],
    defaultRank: RANK,
    createRenderer: () => new RunPlace(model, onCommand)
  };
}

/** Why a widget view shows no live panel, in a sentence, or null while it may still come. */
function whyNotLive(node: HTMLElement, since: number, now: number): string | null {
  const panel = node.querySelector('.traincontrol-panel');
  if (node.querySelector('.jupyter-widgets-disconnected') || panel?.classList.contains('jupyter-widgets-disconnected')) {
    return 'The kernel of this panel restarted or shut down: its widgets are gone.';
  }
  if (now - since < GRACE_MS) {
    return null;
  }
  return (node.textContent ?? '').includes('model not found')
    ? 'The widgets of this panel are gone with the kernel that made them.'
    : 'The widgets of this panel cannot be shown here.';
}

function isLive(node: HTMLElement): boolean {
  const panel = node.querySelector('.traincontrol-panel');
  return panel !== null && !panel.classList.contains('jupyter-widgets-disconnected') && !node.querySelector('.jupyter-widgets-disconnected');
}

export class RunPlaces {
  /**
   * @param app - The application: its main area holds the notebooks.
   * @param model - The runs, as the server lists them.
   * @param rendermime - The application's registry: the run's own renderer is added to it.
   * @param onCommand - Sends a command from a place's buttons.
   */
  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly model: RunsModel,
    rendermime: IRenderMimeRegistry | null,
    private readonly onCommand: CommandHandler
  ) {
    this._factory = runPlaceFactory(model, onCommand);
    this._addFactory(rendermime);
    this._timer = window.setInterval(() => this.scan(), SCAN_MS);
  }

  dispose(): void {
    window.clearInterval(this._timer);
  }

  /** Looks at every output of the open notebooks that names a run (once a second). */
  scan(): void {
    if (document.hidden) {
      return;
    }
    const now = Date.now();
    for (const widget of Array.from(this.app.shell.widgets('main'))) {
      const notebook = (widget as any).content;
      if (!notebook || !Array.isArray(notebook.widgets)) {
        continue;
      }
      this._addFactory(notebook.rendermime ?? null); // a notebook opened before this extension started
      for (const cell of notebook.widgets) {
        const area = cell?.model?.type === 'code' ? cell.outputArea : null;
        if (!area?.model) {
          continue;
        }
        for (let index = 0; index < area.model.length; index++) {
          const ref = runRef(area.model.get(index)?.data?.[RUN_MIME_TYPE]);
          const child = area.widgets[index];
          if (ref && child instanceof Panel) {
            this._check(child, ref, now);
          }
        }
      }
    }
  }

  /** Shows a place in the output `child` if its widget view shows no live panel, or removes it. */
  private _check(child: Panel, ref: IRunRef, now: number): void {
    const view = child.widgets.find(w => w.hasClass('jp-OutputArea-output') && !(w instanceof RunPlace));
    if (!view) {
      return; // the run's own renderer shows the place
    }
    const place = this._places.get(child);
    if (isLive(view.node)) {
      this._since.delete(view);
      if (place) {
        place.dispose();
        this._places.delete(child);
      }
      view.removeClass(HIDDEN_CLASS);
      return;
    }
    const since = this._since.get(view) ?? now;
    this._since.set(view, since);
    const why = whyNotLive(view.node, since, now);
    if (why === null) {
      return;
    }
    let shown = place;
    if (!shown || shown.isDisposed) {
      shown = new RunPlace(this.model, this.onCommand);
      child.addWidget(shown);
      this._places.set(child, shown);
    }
    shown.showRun(ref, why);
    view.addClass(HIDDEN_CLASS);
  }

  private _addFactory(rendermime: IRenderMimeRegistry | null): void {
    if (rendermime && !rendermime.getFactory(RUN_MIME_TYPE)) {
      rendermime.addFactory(this._factory, RANK);
    }
  }

  private _factory: IRenderMime.IRendererFactory;
  private _places = new WeakMap<Panel, RunPlace>();
  private _since = new WeakMap<Widget, number>();
  private _timer: number;
}
