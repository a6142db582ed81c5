/**
 * A small SVG chart of a run's per-epoch loss (and val_loss, dashed).
 */
import { IEpochLogs } from './api';
import { formatNumber } from './format';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 60;
const PAD = 4;

/** The series drawn, in order, with their CSS classes. */
const SERIES: { key: string; cssClass: string }[] = [
  { key: 'loss', cssClass: 'jp-TrainControl-chartLoss' },
  { key: 'val_loss', cssClass: 'jp-TrainControl-chartValLoss' }
];

/**
 * Draws the loss chart of `history` into a new element.
 *
 * @param history - Per-epoch logs, `{epoch, loss, val_loss, ...}`.
 * @returns An element holding the chart and its legend, or null if no
 *   epoch has a loss yet.
 */
export function lossChart(history: IEpochLogs[] | undefined): HTMLElement | null {
  const points = (history ?? []).filter(
    entry => typeof entry.loss === 'number' && isFinite(entry.loss)
  );
  if (points.length === 0) {
    return null;
  }
  const values: number[] = [];
  for (const entry of points) {
    for (const { key } of SERIES) {
      const value = entry[key];
      if (typeof value === 'number' && isFinite(value)) {
        values.push(value);
      }
    }
  }
  const low = Math.min(...values);
  const high = Math.max(...values);
  const span = high - low || Math.abs(high) || 1;
  const first = points[0].epoch;
  const last = points[points.length - 1].epoch;
  const x = (epoch: number) =>
    last === first ? WIDTH / 2 : PAD + ((epoch - first) / (last - first)) * (WIDTH - 2 * PAD);
  const y = (value: number) => PAD + (1 - (value - low) / span) * (HEIGHT - 2 * PAD);

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
      .filter(entry => typeof entry[key] === 'number' && isFinite(entry[key]!))
      .map(entry => `${x(entry.epoch).toFixed(1)},${y(entry[key]!).toFixed(1)}`);
    if (coords.length === 0) {
      continue;
    }
    const shape = document.createElementNS(SVG, coords.length === 1 ? 'circle' : 'polyline');
    if (coords.length === 1) {
      const [cx, cy] = coords[0].split(',');
      shape.setAttribute('cx', cx);
      shape.setAttribute('cy', cy);
      shape.setAttribute('r', '2.5');
    } else {
      shape.setAttribute('points', coords.join(' '));
    }
    shape.setAttribute('class', cssClass);
    shape.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.appendChild(shape);
  }

  const box = document.createElement('div');
  box.className = 'jp-TrainControl-chartBox';
  box.appendChild(svg);
  const legend = document.createElement('div');
  legend.className = 'jp-TrainControl-chartLegend';
  const hasVal = points.some(entry => typeof entry.val_loss === 'number');
  legend.append(
    legendItem('jp-TrainControl-chartLoss', 'loss'),
    ...(hasVal ? [legendItem('jp-TrainControl-chartValLoss', 'val_loss')] : []),
    text('span', 'jp-TrainControl-chartRange',
      `epochs ${first}-${last} · ${formatNumber(low)}-${formatNumber(high)}`)
  );
  box.appendChild(legend);
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
