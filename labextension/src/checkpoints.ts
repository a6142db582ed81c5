/**
 * A run's checkpoints as a card shows them: for an active run one line (how
 * many, the latest); for an ended one each checkpoint's whole file name
 * (wrapping after a `-`, never cut) under the folder that holds them.
 */
import { IRun } from './api';
import { text } from './chart';
import { baseName, dirName, setBreakable, setBreakablePath } from './format';
import { isActive } from './model';

/**
 * The elements that list `run`'s checkpoints.
 *
 * @returns Nothing for an active run without a checkpoint; `no checkpoint`
 *   for an ended one.
 */
export function checkpointElements(run: IRun): HTMLElement[] {
  const paths = run.checkpoints ?? [];
  if (paths.length === 0) {
    return isActive(run) ? [] : [text('div', 'jp-TrainControl-checkpointNone', 'no checkpoint')];
  }
  // Checkpoints of earlier runs of the same name share the folder: say which are this run's.
  const mine = Math.min(paths.length, run.checkpoints_this_run ?? paths.length);
  const earlier = paths.length - mine;
  if (isActive(run)) {
    const counts =
      `${mine} checkpoint${mine === 1 ? '' : 's'} this run` + (earlier > 0 ? `, ${earlier} earlier` : '');
    const summary = text('div', 'jp-TrainControl-checkpointSummary', mine > 0 ? `${counts} · latest ` : counts);
    if (mine > 0) {
      const latest = text('span', 'jp-TrainControl-checkpointLatest', '');
      setBreakable(latest, baseName(paths[paths.length - 1]), '-');
      summary.appendChild(latest);
    }
    summary.title = paths.join('\n');
    return [summary];
  }
  const list = document.createElement('ul');
  list.className = 'jp-TrainControl-checkpoints';
  list.setAttribute('aria-label', 'checkpoints');
  paths.forEach((path, index) => {
    const item = document.createElement('li');
    item.className = 'jp-TrainControl-checkpoint';
    setBreakable(item, baseName(path), '-');
    item.title = path;
    item.dataset.path = path;
    if (index < earlier) {
      item.classList.add('jp-mod-earlier');
      item.title = `${path}\n(an earlier run of ${run.name})`;
    }
    list.appendChild(item);
  });
  const folder = dirName(paths[paths.length - 1]);
  const label = text(
    'div',
    'jp-TrainControl-checkpointLabel',
    `${paths.length === 1 ? 'checkpoint' : `${paths.length} checkpoints`}${earlier > 0 ? ` (${mine} this run)` : ''} in `
  );
  const where = text('span', 'jp-TrainControl-checkpointDir', '');
  setBreakablePath(where, folder);
  where.title = folder;
  label.appendChild(where);
  return [label, list];
}
