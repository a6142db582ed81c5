/**
 * `RunsModel`: the runs of this user as the server extension lists them,
 * polled with backoff, shared by the side panel, the status bar item and the
 * palette commands.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ACTIVE_STATES,
  ApiError,
  Command,
  fetchRuns,
  IRun,
  sendCommand
} from './api';

/**
 * Poll four times a second while a run is active, every second otherwise
 * (so a run that starts shows within a second: at 5 s it took about 3 s).
 * Records are published about twice a second; polling at twice that rate
 * keeps the status bar and cards within about half a second of the run (at
 * the record's rate they lagged by up to a second: an epoch of a small model).
 */
const ACTIVE_INTERVAL_MS = 250;
const IDLE_INTERVAL_MS = 1000;
/** Failures back off up to this interval. */
const MAX_INTERVAL_MS = 30000;

/**
 * Whether a run still trains, is about to, or is winding down. A record of
 * the history whose process went away before it ended (`live: false`) may
 * still say `running`: it is not active.
 */
export function isActive(run: IRun): boolean {
  return ACTIVE_STATES.includes(run.state) && run.live !== false;
}

/** When a run ended, as near as its record says (for ordering). */
export function endedAt(run: IRun): number {
  return run.ended ?? run.updated ?? run.started ?? 0;
}

/**
 * The runs as the side panel lists them: the active ones (oldest first), then
 * the ended ones, newest first.
 */
export function panelOrder(runs: IRun[]): IRun[] {
  const ended = runs.filter(run => !isActive(run)).sort((a, b) => endedAt(b) - endedAt(a));
  return [...runs.filter(isActive), ...ended];
}

/**
 * The record of the run `ref` names: the same instance (`run_id`) if listed,
 * else, without an id, the newest run of that name.
 */
export function findRun(runs: IRun[], ref: { name: string; run_id?: string | null }): IRun | null {
  if (ref.run_id) {
    return runs.find(run => run.run_id === ref.run_id) ?? null;
  }
  const named = runs.filter(run => run.name === ref.name);
  return named.length ? named.reduce((a, b) => ((b.started ?? 0) >= (a.started ?? 0) ? b : a)) : null;
}

/** What one `sendToAll` delivered and what failed. */
export interface ISendReport {
  sent: string[];
  failed: { name: string; message: string }[];
}

/**
 * The runs of this user, refreshed by a `Poll` that backs off on failure
 * and stands by while the page is hidden.
 */
export class RunsModel {
  constructor() {
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: {
        interval: ACTIVE_INTERVAL_MS,
        backoff: true,
        max: MAX_INTERVAL_MS
      },
      name: 'jupyter-traincontrol:runs',
      standby: 'when-hidden'
    });
  }

  /** Emitted after each poll, whether it succeeded or failed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The runs of the last successful poll, oldest first. */
  get runs(): IRun[] {
    return this._runs;
  }

  /** The runs still training (or starting, paused, stopping). */
  get activeRuns(): IRun[] {
    return this._runs.filter(isActive);
  }

  /** Why the last poll failed, or null if it succeeded. */
  get error(): ApiError | null {
    return this._error;
  }

  /** True once a poll has answered (successfully or not). */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Polls now rather than at the next tick; resolves after the poll. */
  async refresh(): Promise<void> {
    await this._poll.refresh();
    await this._poll.tick;
  }

  /**
   * Sends `command` to one run, then refreshes.
   *
   * @returns The server's confirmation message.
   * @throws {ApiError} With the server's message (404 unknown run, 409 the
   *   run is no longer listening, ...).
   */
  async send(name: string, command: Command | string): Promise<string> {
    try {
      const reply = await sendCommand(name, command);
      return reply.message;
    } finally {
      void this.refresh();
    }
  }

  /**
   * Sends `command` to every run that can take it.
   *
   * @param command - `stop` or `save` (or any command).
   * @returns Which runs got it and which did not, with why.
   */
  async sendToAll(command: Command): Promise<ISendReport> {
    const targets = this.activeRuns.filter(run => run.state !== 'stopping');
    const report: ISendReport = { sent: [], failed: [] };
    await Promise.all(
      targets.map(async run => {
        try {
          await sendCommand(run.name, command);
          report.sent.push(run.name);
        } catch (error) {
          report.failed.push({ name: run.name, message: `${error}` });
        }
      })
    );
    void this.refresh();
    return report;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _refresh(): Promise<void> {
    try {
      this._runs = await fetchRuns();
      this._error = null;
    } catch (error) {
      this._error =
        error instanceof ApiError ? error : new ApiError(0, `${error}`);
      this._loaded = true;
      this._changed.emit();
      throw error; // the poll backs off
    }
    this._loaded = true;
    const interval =
      this.activeRuns.length > 0 ? ACTIVE_INTERVAL_MS : IDLE_INTERVAL_MS;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { ...this._poll.frequency, interval };
    }
    this._changed.emit();
  }

  private _poll: Poll;
  private _runs: IRun[] = [];
  private _error: ApiError | null = null;
  private _loaded = false;
  private _changed = new Signal<this, void>(this);
}
