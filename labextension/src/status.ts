/**
 * `RunsStatus`: the status bar item, e.g. `2 training · run-3 epoch 4/20
 * loss 0.213`. Clicking it opens the side panel.
 */
import { Widget } from '@lumino/widgets';

import { summaryText } from './format';
import { RunsModel } from './model';

export class RunsStatus extends Widget {
  /**
   * @param model - The runs to summarise.
   * @param onClick - What a click does (open the side panel).
   */
  constructor(
    private readonly model: RunsModel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-TrainControl-status');
    this.node.title = 'Training runs: click to open the side panel';
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        onClick();
      }
    });
    model.changed.connect(this._render, this);
    this._render();
  }

  /** True while at least one run is active: the item is shown then. */
  get hasActiveRuns(): boolean {
    return this.model.activeRuns.length > 0;
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const summary = summaryText(this.model.activeRuns);
    const stale = this.model.error ? ' (server unreachable)' : '';
    this.node.textContent = summary ? `${summary}${stale}` : '';
  }
}
