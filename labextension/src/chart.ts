/**
 * A small SVG chart of a run's per-epoch loss (and val_loss, dashed).
 *
 * Losses often fall by orders of magnitude in the first epochs, so the
 * y axis is logarithmic when all values are positive and span more than
 * a factor of 5; the top and bottom values are labelled on the chart.
 */
import { IEpochLogs } from './api';
import { formatNumber } from './format';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 60;
const PAD = 5;
const LOG_SPAN = 5;

/** The series drawn, in order, with their CSS classes. */
const SERIES: { key: string; cssClass: string }[] = [
  { key: 'loss', cssClass: 'jp-TrainControl-chartLoss' },
  { key: 'val_loss', cssClass: 'jp-TrainControl-chartValLoss' }
];

function finite(value: unknown): value is number {
  return typeof value === 'number' && isFinite(value);
}

/**
 * Draws the loss chart of `history` into a new element.
 *
 * @param history - Per-epoch logs, `{epoch, loss, val_loss, ...}`.
 * @returns An element holding the chart and its legend, or null if no
 *   epoch has a loss yet.
 */
export function lossChart(history: IEpochLogs[] | undefined): HTMLElement | null {
  const points = (history ?? []).filter(entry => finite(entry.loss));
  if (points.length === 0) {
    return null;
  }
  const values = points.flatMap(entry => SERIES.map(({ key }) => entry[key]).filter(finite));
  const low = Math.min(...values);
  const high = Math.max(...values);
  const log = low > 0 && high / low > LOG_SPAN;
  const scale = (value: number) => (log ? Math.log(value) : value);
  const bottom = scale(low);
  const span = scale(high) - bottom || 1;
  const first = points[0].epoch;
  const last = points[points.length - 1].epoch;
  const x = (epoch: number) =>
    last === first ? WIDTH / 2 : PAD + ((epoch - first) / (last - first)) * (WIDTH - 2 * PAD);
  const y = (value: number) => PAD + (1 - (scale(value) - bottom) / span) * (HEIGHT - 2 * PAD);

  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('class', 'jp-TrainControl-chart');
  svg.setAttribute('role', 'img');
  svg.setAttribute(
    'aria-label',
    `loss by epoch, from ${formatNumber(points[0].loss)} to ${formatNumber(points[points.length - 1].loss)}`
  );
  for (const { key, cssClass } of SERIES) {
    const coords = points
      .filter(entry => finite(entry[key]))
      .map(entry => [x(entry.epoch), y(entry[key] as number)]);
    if (coords.length === 0) {
      continue;
    }
    let shape: SVGElement;
    if (coords.length === 1) {
      shape = document.createElementNS(SVG, 'circle');
      shape.setAttribute('cx', coords[0][0].toFixed(1));
      shape.setAttribute('cy', coords[0][1].toFixed(1));
      shape.setAttribute('r', '2.5');
    } else {
      shape = document.createElementNS(SVG, 'polyline');
      shape.setAttribute('points', coords.map(([cx, cy]) => `${cx.toFixed(1)},${cy.toFixed(1)}`).join(' '));
      shape.setAttribute('vector-effect', 'non-scaling-stroke');
    }
    shape.setAttribute('class', cssClass);
    svg.appendChild(shape);
  }

  const plot = document.createElement('div');
  plot.className = 'jp-TrainControl-plot';
  plot.append(
    svg,
    text('span', 'jp-TrainControl-axis jp-mod-top', formatNumber(high)),
    text('span', 'jp-TrainControl-axis jp-mod-bottom', formatNumber(low))
  );
  const legend = document.createElement('div');
  legend.className = 'jp-TrainControl-chartLegend';
  legend.appendChild(legendItem('jp-TrainControl-chartLoss', 'loss'));
  if (points.some(entry => finite(entry.val_loss))) {
    legend.appendChild(legendItem('jp-TrainControl-chartValLoss', 'val_loss'));
  }
  const range = first === last ? `epoch ${first}` : `epochs ${first}–${last}`;
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
