/**
 * Words and numbers for runs: progress, metrics, where a run lives, and the
 * one-line summary of the status bar. Pure functions, no DOM.
 */
import { IRun } from './api';

/** A non-breaking space: keeps `loss 0.21` or `pid 4711` on one line. */
export const NBSP = '\u00a0';

/**
 * A number as both panels show it (metrics, the learning rate): 3
 * significant digits, in exponent form below 0.001 and from 100000 on:
 * `0.213`, `0.001`, `3e-4`, `1.25e-5`, `2.5e5`. A record's null (a NaN or an
 * infinity, as records write them) reads `nan`; anything else not a number,
 * `-`. The notebook panel's `number_text` (Python) follows the same rule.
 */
export function formatNumber(value: unknown): string {
  if (value === null) {
    return 'nan';
  }
  if (typeof value !== 'number') {
    return '-';
  }
  if (!isFinite(value)) {
    return isNaN(value) ? 'nan' : value > 0 ? 'inf' : '-inf';
  }
  if (value === 0) {
    return '0';
  }
  const abs = Math.abs(value);
  if (abs < 1e-3 || abs >= 1e5) {
    const [mantissa, exponent] = value.toExponential(2).split('e');
    return `${mantissa.replace(/\.?0+$/, '')}e${Number(exponent)}`;
  }
  return String(Number(value.toPrecision(3)));
}

/** `done/total`, `done` when the total is unknown, `-` before the start. */
export function fraction(done?: number | null, total?: number | null): string {
  if (!done && !total) {
    return '-';
  }
  return total ? `${done ?? 0}/${total}` : `${done ?? 0}`;
}

/** `epoch 4/20`, or '' before the first epoch. */
export function epochText(run: IRun): string {
  return run.epoch ? `epoch${NBSP}${fraction(run.epoch, run.epochs)}` : '';
}

/** The latest metrics, loss first: `loss 0.2131 · val_loss 0.245 · mae 0.3`. */
export function metricsText(run: IRun, limit = 4): string {
  const metrics = run.metrics ?? {};
  const names = Object.keys(metrics).sort((a, b) => rank(a) - rank(b));
  return names
    .slice(0, limit)
    .map(name => `${name}${NBSP}${formatNumber(metrics[name])}`)
    .join(' · ');
}

function rank(metric: string): number {
  const order = ['loss', 'val_loss'];
  const index = order.indexOf(metric);
  return index < 0 ? order.length + (metric.startsWith('val_') ? 1 : 0) : index;
}

/** The file name of a path (`a/b/c.ipynb` -> `c.ipynb`). */
export function baseName(path: string): string {
  const parts = path.split(/[\\/]/);
  return parts[parts.length - 1] || path;
}

/**
 * Fills `element` with `path`, breakable only after each `/` (a `<wbr>`
 * there), so a long path wraps at folder boundaries, never mid-name.
 */
export function setBreakablePath(element: HTMLElement, path: string): void {
  setBreakable(element, path, '/');
}

/**
 * Fills `element` with `text`, breakable only after each `separator` (a
 * `<wbr>` there): `ckpt-000002-epoch0007-step000012.keras` wraps after a
 * `-` when it does not fit, and is never cut.
 */
export function setBreakable(element: HTMLElement, text: string, separator: string): void {
  element.replaceChildren();
  const parts = text.split(separator);
  parts.forEach((part, index) => {
    element.append(index < parts.length - 1 ? `${part}${separator}` : part);
    if (index < parts.length - 1) {
      element.appendChild(document.createElement('wbr'));
    }
  });
}

/** The folder of a path (`a/b/c.keras` -> `a/b`). */
export function dirName(path: string): string {
  const index = Math.max(path.lastIndexOf('/'), path.lastIndexOf('\\'));
  return index > 0 ? path.slice(0, index) : path;
}

/**
 * Where the run lives, in a few words: its notebook if the run belongs to a
 * kernel of this server, else its kernel or its process.
 */
export function whereText(run: IRun): string {
  if (run.notebook_path) {
    return run.notebook_path;
  }
  if (run.kernel_id) {
    const on = run.kernel_on_this_server ? 'this server' : 'another server';
    return `kernel ${run.kernel_id.slice(0, 8)} (${on})`;
  }
  const origin = run.origin || 'process';
  return run.pid ? `${origin} · pid${NBSP}${run.pid}` : origin;
}

/** `45s`, `3m05s`, `2h04m`. */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  }
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/** `3m05s ago`, or `just now` under 5 s. */
export function ago(seconds: number): string {
  return seconds < 5 ? 'just now' : `${duration(seconds)} ago`;
}

/**
 * How an ended run ended, in words (from its `end_reason`, else its state):
 * `Stopped by a kernel interrupt`, `Finished: training ran to its end`.
 */
export function outcomeText(run: IRun): string {
  const state = run.state.charAt(0).toUpperCase() + run.state.slice(1);
  if (run.state === 'finished' && (run.end_reason ?? 'finished') === 'finished' && !run.epoch) {
    return 'Ended: nothing trained (the cell ran no fit or TrainLoop)';
  }
  switch (run.end_reason) {
    case 'finished':
      return 'Finished: training ran to its end';
    case 'callback':
      return `Stopped early by ${run.stopped_by || 'a callback'}`;
    case 'command':
      return `${state} by a command`;
    case 'interrupt':
      return `${state} by a kernel interrupt`;
    case 'kernel-restart':
      return `${state} when its kernel restarted or shut down`;
    case 'error':
      return 'Failed: the training raised an error';
    case 'nan':
      return `${state}: the loss was not a finite number`;
    case 'process-gone':
      return 'Lost: its process ended before the run did (killed, or crashed)';
  }
  if (run.live === false && !['stopped', 'aborted', 'finished', 'failed'].includes(run.state)) {
    return 'Lost: its process is gone';
  }
  switch (run.state) {
    case 'finished':
      return 'Finished: training ran to its end';
    case 'failed':
      return 'Failed: the training raised an error';
  }
  return state;
}

/**
 * How to continue a run whose process died (`process-gone`) from its newest
 * checkpoint; '' for any other run, or one that left none. The CLI's
 * `list --all` says the same (`protocol.endings.resume_hint`).
 */
export function resumeHint(run: IRun): string {
  const checkpoints = run.checkpoints ?? [];
  if (run.end_reason !== 'process-gone' || checkpoints.length === 0) {
    return '';
  }
  const newest = baseName(checkpoints[checkpoints.length - 1]);
  const how =
    run.origin === 'notebook'
      ? `%%interruptible_fit --name ${run.name} --resume`
      : `resume=True (run ${run.name})`;
  return `Its newest checkpoint is ${newest}: continue from it with ${how}.`;
}

/** Where an ended run ended: `epoch 7/30 · batch 12/26`, or '' before its first batch. */
export function whereEnded(run: IRun): string {
  if (!run.epoch) {
    return '';
  }
  const batch = run.step || run.steps ? ` · batch${NBSP}${fraction(run.step, run.steps)}` : '';
  return `${epochText(run)}${batch}`;
}

/**
 * The status bar's words for the active runs, e.g.
 * `2 training · run-3 epoch 4/20 loss 0.213`; '' when none is active.
 *
 * The run named is the most recently started one.
 */
export function summaryText(active: IRun[]): string {
  if (active.length === 0) {
    return '';
  }
  const paused = active.filter(run => run.state === 'paused').length;
  const training = active.length - paused;
  const counts: string[] = [];
  if (training) {
    counts.push(`${training} training`);
  }
  if (paused) {
    counts.push(`${paused} paused`);
  }
  const latest = active.reduce((a, b) =>
    (b.started ?? 0) >= (a.started ?? 0) ? b : a
  );
  const details = [latest.name];
  // The counts already say running or paused; name only the other states.
  if (latest.state !== 'running' && latest.state !== 'paused') {
    details.push(latest.state);
  }
  const epoch = epochText(latest);
  if (epoch) {
    details.push(epoch);
  }
  const loss = latest.metrics?.loss;
  if (typeof loss === 'number') {
    details.push(`loss ${formatNumber(loss)}`);
  }
  return `${counts.join(', ')} · ${details.join(' ')}`;
}
