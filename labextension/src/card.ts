/**
 * `RunCard`: one run in the side panel. Its buttons are created once and
 * kept, so a poll that redraws the card never swallows a click.
 */
import { Command, IRun } from './api';
import { lossChart, text } from './chart';
import { checkpointElements } from './checkpoints';
import {
  ago,
  duration,
  epochText,
  formatNumber,
  fraction,
  metricsText,
  NBSP,
  outcomeText,
  resumeHint,
  whereEnded,
  whereText
} from './format';
import { isActive } from './model';
import { allowedFor, helpFor } from './vocabulary';

/** Called when a button is pressed (or Enter in the learning-rate field,
 * with a `set lr=…` line); resolves to the words to show. */
export type CommandHandler = (run: IRun, command: Command | string) => Promise<string>;

const BUTTONS: { label: string; command: Command }[] = [
  { label: 'Save', command: 'save' },
  { label: 'Stop', command: 'stop' },
  { label: 'Abort', command: 'abort' },
  { label: 'Pause', command: 'pause' },
  { label: 'Rollback', command: 'rollback' }
];

/** The learning rate as the field shows it (as the notebook panel does: `3e-4`, `0.001`). */
export function learningRateText(value: number | null | undefined): string {
  return typeof value === 'number' ? formatNumber(value) : '';
}

export class RunCard {
  /**
   * @param onCommand - Sends a command; its promise's value (or error) is
   *   shown on the card.
   */
  constructor(private readonly onCommand: CommandHandler) {
    this.node = document.createElement('div');
    this.node.className = 'jp-TrainControl-run';
    this._body = document.createElement('div');
    this._body.className = 'jp-TrainControl-runBody';
    this._feedback = text('div', 'jp-TrainControl-feedback', '');
    this._feedback.setAttribute('aria-live', 'polite');
    this._buttons = document.createElement('div');
    this._buttons.className = 'jp-TrainControl-buttons';
    for (const spec of BUTTONS) {
      const button = document.createElement('button');
      button.type = 'button';
      button.className = 'jp-TrainControl-button';
      button.textContent = spec.label;
      button.dataset.command = spec.command;
      button.addEventListener('click', () => void this._press(button));
      this._buttons.appendChild(button);
    }
    // The learning rate, editable: Enter sends `set lr=VALUE`.
    this._lr = document.createElement('label');
    this._lr.className = 'jp-TrainControl-lr';
    this._lr.append(text('span', 'jp-TrainControl-lrLabel', 'lr'));
    this._lrInput = document.createElement('input');
    this._lrInput.type = 'text';
    this._lrInput.inputMode = 'decimal';
    this._lrInput.spellcheck = false;
    this._lrInput.className = 'jp-TrainControl-lrInput';
    this._lrInput.title = 'The learning rate: type a new one and press Enter to set it at the next batch';
    this._lrInput.setAttribute('aria-label', 'learning rate');
    this._lrInput.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        event.preventDefault();
        void this._setLearningRate();
      } else if (event.key === 'Escape') {
        this._lrInput.value = this._shownLr;
        this._lrInput.blur();
      }
    });
    this._lrInput.addEventListener('blur', () => {
      if (!this._pending) {
        this._lrInput.value = this._shownLr; // left without Enter: nothing was sent
      }
    });
    this._lr.append(this._lrInput);
    this._buttons.appendChild(this._lr);
    this._footer = document.createElement('div');
    this._footer.className = 'jp-TrainControl-runFooter';
    this.node.append(this._body, this._buttons, this._feedback, this._footer);
  }

  /** The card's element. */
  readonly node: HTMLElement;

  /** The run shown. */
  get run(): IRun | null {
    return this._run;
  }

  /**
   * Redraws the card for `run` (a newer record of the same run).
   *
   * @param now - The time in seconds, for ages.
   */
  update(run: IRun, now: number): void {
    const active = isActive(run);
    if (this._run && isActive(this._run) && !active && !['stop', 'abort'].includes(this._lastCommand)) {
      // The run ended by other means: what this card last sent is stale news.
      this._feedback.textContent = '';
    }
    this._run = run;
    this.node.dataset.run = run.name;
    this.node.dataset.state = run.state;
    if (run.end_reason) {
      this.node.dataset.endReason = run.end_reason;
    } else {
      delete this.node.dataset.endReason;
    }
    this.node.classList.toggle('jp-mod-ended', !active);

    const head = document.createElement('div');
    head.className = 'jp-TrainControl-runHead';
    const name = text('span', 'jp-TrainControl-runName', run.name);
    name.title = run.checkpoint_dir ? `${run.name}\ncheckpoints in ${run.checkpoint_dir}` : run.name;
    // A record whose process went away mid-run still says `running`: say it is lost.
    const lost = !active && !['stopped', 'aborted', 'finished', 'failed'].includes(run.state);
    const shown = lost ? 'lost' : run.state;
    const state = text('span', `jp-TrainControl-state jp-TrainControl-state-${shown}`, shown);
    head.append(name, state);

    const where = text('div', 'jp-TrainControl-where', whereText(run));
    where.title = run.notebook_path
      ? `notebook ${run.notebook_path}, kernel ${run.kernel_id}`
      : `${run.origin ?? 'process'} (pid ${run.pid ?? '?'})`;

    const parts: HTMLElement[] = [head, where, active ? this._progress(run, now) : this._outcome(run, now)];
    const metrics = metricsText(run);
    if (metrics) {
      parts.push(text('div', 'jp-TrainControl-metrics', metrics));
    }
    const chart = lossChart(run);
    if (chart) {
      parts.push(chart);
    }
    if (run.error) {
      const lines = run.error.trim().split('\n');
      const error = text('div', 'jp-TrainControl-runError', lines[lines.length - 1]);
      error.title = run.error;
      parts.push(error);
    }
    this._body.replaceChildren(...parts);

    this._buttons.hidden = !active;
    const allowed = allowedFor(run);
    for (const button of Array.from(this._buttons.querySelectorAll('button'))) {
      if (button.dataset.command === 'pause' || button.dataset.command === 'resume') {
        const paused = allowed.includes('resume');
        button.dataset.command = paused ? 'resume' : 'pause';
        button.textContent = paused ? 'Resume' : 'Pause';
      }
      const command = button.dataset.command as Command;
      button.title = helpFor(command);
      button.disabled = this._pending || !allowed.includes(command);
      if (command === 'rollback' && !(run.checkpoints ?? []).length) {
        button.disabled = true;
        button.title = `${helpFor(command)} (no checkpoint yet)`;
      }
    }
    this._updateLearningRate(run, allowed);
    this._footer.replaceChildren(...checkpointElements(run));
  }

  /** How an ended run ended, where, after how long, and when. */
  private _outcome(run: IRun, now: number): HTMLElement {
    const box = document.createElement('div');
    box.className = 'jp-TrainControl-outcome';
    box.appendChild(text('div', 'jp-TrainControl-outcomeText', outcomeText(run)));
    const words: string[] = [];
    const where = whereEnded(run);
    words.push(where ? `at ${where}` : 'before its first batch');
    if (run.started && run.ended) {
      words.push(`ran${NBSP}${duration(run.ended - run.started)}`);
    }
    if (run.ended) {
      words.push(`ended${NBSP}${ago(now - run.ended)}`);
      box.title = `ended ${new Date(run.ended * 1000).toLocaleString()}`;
    }
    box.appendChild(text('div', 'jp-TrainControl-progressText', words.join(' · ')));
    const hint = resumeHint(run);
    if (hint) {
      box.appendChild(text('div', 'jp-TrainControl-resumeHint', hint));
    }
    return box;
  }

  private _progress(run: IRun, now: number): HTMLElement {
    const box = document.createElement('div');
    box.className = 'jp-TrainControl-progress';
    const words: string[] = [];
    const end = run.ended ?? now;
    if (run.started) {
      const elapsed = duration(end - run.started);
      words.push(isActive(run) ? `${elapsed}${NBSP}elapsed` : `ran${NBSP}${elapsed}`);
    }
    if (!run.epoch) {
      words.unshift('waiting for the first batch');
    }
    // Two bars, labelled: the epoch in progress, and the whole run.
    if (run.epoch) {
      const batches = run.step || run.steps ? ` · batch${NBSP}${fraction(run.step, run.steps)}` : '';
      const inEpoch = run.steps ? Math.min(1, (run.step ?? 0) / run.steps) : 0;
      box.appendChild(this._bar(`${epochText(run).replace('epoch', 'Epoch')}${batches}`, inEpoch, 'epoch'));
      if (run.epochs) {
        const done = Math.max(0, run.epoch - 1) + inEpoch;
        box.appendChild(this._bar(`Run ${Math.floor((100 * done) / run.epochs)}%`, done / run.epochs, 'run'));
      }
    }
    box.appendChild(text('div', 'jp-TrainControl-progressText', words.join(' · ')));
    return box;
  }

  private _bar(label: string, fraction: number, kind: string): HTMLElement {
    const row = document.createElement('div');
    row.className = `jp-TrainControl-barRow jp-mod-${kind}`;
    const bar = document.createElement('div');
    bar.className = 'jp-TrainControl-bar';
    bar.setAttribute('role', 'progressbar');
    bar.setAttribute('aria-label', label);
    bar.setAttribute('aria-valuemin', '0');
    bar.setAttribute('aria-valuemax', '100');
    bar.setAttribute('aria-valuenow', (100 * fraction).toFixed(0));
    const fill = document.createElement('div');
    fill.className = 'jp-TrainControl-barFill';
    fill.style.width = `${Math.min(100, 100 * fraction).toFixed(1)}%`;
    bar.appendChild(fill);
    row.append(text('span', 'jp-TrainControl-barLabel', label), bar);
    return row;
  }

  private async _press(button: HTMLButtonElement): Promise<void> {
    const run = this._run;
    const command = button.dataset.command as Command;
    if (!run || this._pending) {
      return;
    }
    this._lastCommand = command;
    this._setPending(true);
    this._feedback.classList.remove('jp-mod-error');
    this._feedback.textContent = `sending ${command}…`;
    try {
      this._feedback.textContent = await this.onCommand(run, command);
    } catch (error) {
      this._feedback.classList.add('jp-mod-error');
      this._feedback.textContent = error instanceof Error ? error.message : `${error}`;
    } finally {
      this._setPending(false);
    }
  }

  /** Shows the run's learning rate; never over what is being typed. */
  private _updateLearningRate(run: IRun, allowed: Command[]): void {
    const shown = learningRateText(run.tunables?.learning_rate);
    this._lr.hidden = shown === '';
    this._lrInput.disabled = this._pending || !allowed.includes('set');
    const editing = document.activeElement === this._lrInput && this._lrInput.value !== this._shownLr;
    if (shown !== this._shownLr && !editing) {
      this._lrInput.value = shown;
    }
    this._shownLr = shown;
    const values = Object.entries(run.tunables ?? {})
      .map(([name, value]) => `${name}=${value === null ? 'off' : learningRateText(value)}`)
      .join(', ');
    this._lrInput.title =
      'The learning rate: type a new one and press Enter to set it at the next batch' +
      (values ? `\nNow: ${values}` : '');
  }

  private async _setLearningRate(): Promise<void> {
    const run = this._run;
    const value = this._lrInput.value.trim();
    if (!run || this._pending || value === '' || value === this._shownLr) {
      return;
    }
    this._lastCommand = 'set';
    this._setPending(true);
    this._feedback.classList.remove('jp-mod-error');
    this._feedback.textContent = `sending set lr=${value}…`;
    try {
      this._feedback.textContent = await this.onCommand(run, `set lr=${value}`);
    } catch (error) {
      this._feedback.classList.add('jp-mod-error');
      this._feedback.textContent = error instanceof Error ? error.message : `${error}`;
      this._lrInput.value = this._shownLr;
    } finally {
      this._setPending(false);
    }
  }

  private _setPending(pending: boolean): void {
    this._pending = pending;
    if (this._run) {
      this.update(this._run, Date.now() / 1000);
    }
  }

  private _run: IRun | null = null;
  private _pending = false;
  private _lastCommand = '';
  private _body: HTMLElement;
  private _buttons: HTMLElement;
  private _lr: HTMLElement;
  private _lrInput: HTMLInputElement;
  private _shownLr = '';
  private _feedback: HTMLElement;
  private _footer: HTMLElement;
}
