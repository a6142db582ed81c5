/**
 * `RunsPanel`: the "Training runs" side panel. One card per run: the active
 * runs first, then the ended ones (greyed, newest first, from the server's
 * history, across kernel and server restarts); an unreachable server
 * extension is shown as such.
 */
import { Widget } from '@lumino/widgets';

import { Command, IRun } from './api';
import { RunCard } from './card';
import { text } from './chart';
import { confirmCommand } from './confirm';
import { isActive, panelOrder, RunsModel } from './model';

export const PANEL_ID = 'jp-traincontrol-panel';

export class RunsPanel extends Widget {
  constructor(private readonly model: RunsModel) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-TrainControl-panel');
    this.title.caption = 'Training runs';

    const header = document.createElement('header');
    header.className = 'jp-TrainControl-header';
    header.appendChild(text('h2', 'jp-TrainControl-title', 'Training runs'));
    this._summary = text('span', 'jp-TrainControl-count', '');
    header.appendChild(this._summary);
    this._banner = text('div', 'jp-TrainControl-banner', '');
    this._banner.setAttribute('role', 'status');
    this._list = document.createElement('div');
    this._list.className = 'jp-TrainControl-list';
    this.node.append(header, this._banner, this._list);

    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const { runs, error, loaded } = this.model;
    const now = Date.now() / 1000;
    this.node.classList.toggle('jp-mod-unreachable', error !== null);
    if (error) {
      this._banner.className = 'jp-TrainControl-banner jp-mod-error';
      const title = error.status === 404 ? 'Server extension not found' : 'Cannot list the training runs';
      this._banner.replaceChildren(
        text('div', 'jp-TrainControl-bannerTitle', title),
        text('div', 'jp-TrainControl-bannerMessage', error.message),
        text(
          'div',
          'jp-TrainControl-bannerRetry',
          runs.length
            ? 'Retrying, less and less often. The runs below may be out of date.'
            : 'Retrying, less and less often.'
        )
      );
    } else if (!loaded) {
      this._banner.className = 'jp-TrainControl-banner';
      this._banner.textContent = 'Loading…';
    } else if (runs.length === 0) {
      this._banner.className = 'jp-TrainControl-banner jp-mod-empty';
      this._banner.textContent =
        'No training runs. Runs appear here when a fit with ControlCallback ' +
        '(or %%interruptible_fit) starts, in a notebook or a script.';
    } else {
      this._banner.className = 'jp-TrainControl-banner jp-mod-hidden';
      this._banner.textContent = '';
    }
    const active = runs.filter(isActive);
    this._summary.textContent = loaded && !error ? `${active.length} active · ${runs.length - active.length} ended` : '';

    const ordered = panelOrder(runs);
    const seen = new Set<string>();
    const nodes: HTMLElement[] = [];
    for (const run of ordered) {
      const key = run.run_id ?? run.name;
      seen.add(key);
      let card = this._cards.get(key);
      if (!card) {
        card = new RunCard((target, command) => this._send(target, command));
        this._cards.set(key, card);
      }
      card.update(run, now);
      card.node.classList.toggle('jp-mod-stale', error !== null);
      nodes.push(card.node);
    }
    for (const key of Array.from(this._cards.keys())) {
      if (!seen.has(key)) {
        this._cards.delete(key);
      }
    }
    // Re-append only when the order changed, so a card under the mouse
    // stays in place (and keeps its click) across polls.
    const current = Array.from(this._list.children);
    if (current.length !== nodes.length || current.some((node, i) => node !== nodes[i])) {
      this._list.replaceChildren(...nodes);
    }
  }

  private async _send(run: IRun, command: Command | string): Promise<string> {
    if (!(await confirmCommand(run.name, command))) {
      return '';
    }
    return this.model.send(run.name, command);
  }

  private _cards = new Map<string, RunCard>();
  private _summary: HTMLElement;
  private _banner: HTMLElement;
  private _list: HTMLElement;
}
