/**
 * A small SVG chart of a run's loss: per batch, smoothed as TensorBoard
 * does (a debiased exponential moving average, the raw values faint
 * behind), with the per-epoch val_loss on top (dashed). So a long first
 * epoch already shows its fall.
 *
 * One scale policy with the notebook panel's chart (Python,
 * `jupyter_traincontrol/loss_curve.py`): the y axis is logarithmic only
 * when all values are > 0 and span more than 10x. The axis labels sit in a
 * gutter left of the plot and the legend below it, never on the lines.
 */
import { IEpochLogs, IRun } from './api';
import { formatNumber } from './format';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 60;
const PAD = 4;
/** Log scale only when max / min exceeds this (and all values > 0). */
export const LOG_SPAN = 10;
/** TensorBoard's default smoothing weight. */
export const SMOOTHING = 0.6;

type Point = [number, number];

function finite(value: unknown): value is number {
  return typeof value === 'number' && isFinite(value);
}

/** The debiased exponential moving average of `values` (TensorBoard's). */
export function smooth(values: number[], weight = SMOOTHING): number[] {
  let last = 0;
  return values.map((value, index) => {
    last = last * weight + (1 - weight) * value;
    return last / (1 - Math.pow(weight, index + 1));
  });
}

/** True when all values are > 0 and span more than `LOG_SPAN` times. */
export function useLogScale(values: number[]): boolean {
  if (values.length === 0) {
    return false;
  }
  const low = Math.min(...values);
  return low > 0 && Math.max(...values) / low > LOG_SPAN;
}

/**
 * The series to draw: the loss per batch when the record has it, else per
 * epoch; val_loss per epoch, at the batch where the epoch ended.
 */
function series(run: Pick<IRun, 'history' | 'loss_curve'>): { loss: Point[]; val: Point[]; unit: string } {
  const history: IEpochLogs[] = run.history ?? [];
  const curve = (run.loss_curve ?? []).filter((p): p is Point => finite(p[1]));
  if (curve.length > 0) {
    const val = history
      .filter(entry => finite(entry.val_loss) && finite(entry.batch))
      .map(entry => [entry.batch as number, entry.val_loss as number] as Point);
    return { loss: curve, val, unit: 'batch' };
  }
  const loss = history.filter(entry => finite(entry.loss)).map(entry => [entry.epoch, entry.loss as number] as Point);
  const val = history.filter(entry => finite(entry.val_loss)).map(entry => [entry.epoch, entry.val_loss as number] as Point);
  return { loss, val, unit: 'epoch' };
}

/**
 * Draws the loss chart of `run` into a new element.
 *
 * @returns An element holding the chart, its axis labels and legend, or
 *   null while there is no loss yet.
 */
export function lossChart(run: Pick<IRun, 'history' | 'loss_curve'>): HTMLElement | null {
  const { loss, val, unit } = series(run);
  if (loss.length === 0 && val.length === 0) {
    return null;
  }
  const values = [...loss, ...val].map(([, v]) => v);
  const low = Math.min(...values);
  const high = Math.max(...values);
  const log = useLogScale(values);
  const scale = (value: number) => (log ? Math.log10(value) : value);
  const bottom = scale(low);
  const span = scale(high) - bottom || 1;
  const xs = [...loss, ...val].map(([x]) => x);
  const first = unit === 'batch' ? 0 : Math.min(...xs);
  const last = Math.max(...xs);
  const x = (value: number) =>
    last === first ? WIDTH / 2 : PAD + ((value - first) / (last - first)) * (WIDTH - 2 * PAD);
  const y = (value: number) => PAD + (1 - (scale(value) - bottom) / span) * (HEIGHT - 2 * PAD);

  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('class', 'jp-TrainControl-chart');
  svg.setAttribute('role', 'img');
  svg.setAttribute(
    'aria-label',
    `loss by ${unit}, from ${formatNumber(loss[0]?.[1])} to ${formatNumber(loss[loss.length - 1]?.[1])}`
  );
  const draw = (points: Point[], cssClass: string) => {
    let shape: SVGElement;
    if (points.length === 1) {
      shape = document.createElementNS(SVG, 'circle');
      shape.setAttribute('cx', x(points[0][0]).toFixed(1));
      shape.setAttribute('cy', y(points[0][1]).toFixed(1));
      shape.setAttribute('r', '2.5');
    } else {
      shape = document.createElementNS(SVG, 'polyline');
      shape.setAttribute('points', points.map(([px, py]) => `${x(px).toFixed(1)},${y(py).toFixed(1)}`).join(' '));
      shape.setAttribute('vector-effect', 'non-scaling-stroke');
    }
    shape.setAttribute('class', cssClass);
    svg.appendChild(shape);
  };
  if (loss.length > 1) {
    draw(loss, 'jp-TrainControl-chartRaw');
    const smoothed = smooth(loss.map(([, v]) => v));
    draw(loss.map(([px], i) => [px, smoothed[i]] as Point), 'jp-TrainControl-chartLoss');
  } else if (loss.length === 1) {
    draw(loss, 'jp-TrainControl-chartLoss');
  }
  if (val.length > 0) {
    draw(val, 'jp-TrainControl-chartValLoss');
  }

  const gutter = document.createElement('div');
  gutter.className = 'jp-TrainControl-gutter';
  gutter.append(
    text('span', 'jp-TrainControl-axis', formatNumber(high)),
    text('span', 'jp-TrainControl-axis', formatNumber(low))
  );
  const plot = document.createElement('div');
  plot.className = 'jp-TrainControl-plot';
  plot.append(gutter, svg);

  const legend = document.createElement('div');
  legend.className = 'jp-TrainControl-chartLegend';
  legend.appendChild(legendItem('jp-TrainControl-chartLoss', unit === 'batch' ? 'loss (smoothed)' : 'loss'));
  if (val.length > 0) {
    legend.appendChild(legendItem('jp-TrainControl-chartValLoss', 'val_loss'));
  }
  const range = `${unit} ${first}–${last}`;
  legend.appendChild(text('span', 'jp-TrainControl-chartRange', log ? `${range}, log scale` : range));

  const box = document.createElement('div');
  box.className = 'jp-TrainControl-chartBox';
  box.append(plot, legend);
  return box;
}

function legendItem(cssClass: string, label: string): HTMLElement {
  const item = text('span', 'jp-TrainControl-legendItem', label);
  const swatch = document.createElement('span');
  swatch.className = `jp-TrainControl-swatch ${cssClass}`;
  item.prepend(swatch);
  return item;
}

/** An element of `tag` with class `cssClass` and text `content`. */
export function text(tag: string, cssClass: string, content: string): HTMLElement {
  const element = document.createElement(tag);
  element.className = cssClass;
  element.textContent = content;
  return element;
}
