/**
 * The one helper that talks to the server extension's REST API, and the
 * shape of what it returns.
 *
 *   GET  <base_url>/traincontrol/api/runs?all=true   live runs, then the ended ones of the history
 *   POST <base_url>/traincontrol/api/runs/<name>/commands   {"command": "stop"}
 *
 * `IRun` lists every field of a record (`jupyter_traincontrol/protocol/record.py`,
 * `FIELDS`) plus those the lister and the server add; a test compares them.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The commands a run obeys at its next batch boundary. */
export type Command = 'stop' | 'save' | 'abort' | 'pause' | 'resume' | 'set' | 'rollback';

/** One change `set`, `rollback` or the NaN policy made to a run. */
export interface IChange {
  time: number;
  /** What sent it: the command line and its id (`cli-…`, `rest-…`, `panel-…`), or `on_nan=rollback`. */
  by: string;
  name: string;
  old: number | null;
  new: number;
}

/** States of a run that still trains, is about to, or is winding down. */
export const ACTIVE_STATES = ['starting', 'running', 'paused', 'stopping'];

/**
 * How an ended run ended (the record's `end_reason`): `fit` ran to its end,
 * a callback of the user's ended it early, a command (stop, abort), a kernel interrupt, a kernel restart or shutdown,
 * an exception, a loss that was not finite, or its process went away first.
 */
export type EndReason =
  | 'finished'
  | 'callback'
  | 'command'
  | 'interrupt'
  | 'kernel-restart'
  | 'error'
  | 'nan'
  | 'process-gone';

/** A job's process, as its record lists it. */
export interface IProcess {
  process: number;
  state?: string;
  step?: number;
  [key: string]: unknown;
}

/** What became of a request with an id. */
export interface IAck {
  ids: string[];
  command?: string;
  outcome: string;
  message: string;
  time?: number;
}

/** One epoch's final metrics, as kept in a run's record. */
export interface IEpochLogs {
  epoch: number;
  /** Batches done at the epoch's end, counted across epochs. */
  batch?: number;
  loss?: number;
  val_loss?: number;
  [metric: string]: number | undefined;
}

/** One line of a run's log. */
export interface IRunEvent {
  time: number;
  kind: string;
  message: string;
}

/**
 * A run as `GET runs?all=true` lists it: the record that `jupyter-traincontrol
 * list --all --json` prints, plus what the server knows of the run's kernel.
 */
export interface IRun {
  // The record's fields (protocol/record.py FIELDS), in its order.
  name: string;
  run_id?: string;
  pid?: number;
  state: string;
  updated?: number | null;
  started?: number | null;
  ended?: number | null;
  origin?: string | null;
  /** The commands that make sense in the run's state (the vocabulary's table). */
  commands?: Command[] | null;
  channel?: 'fifo' | 'spool' | null;
  fifo?: string | null;
  address?: string | null;
  checkpoint_dir?: string | null;
  /** Its complete checkpoints, oldest first. */
  checkpoints?: string[] | null;
  /** How many of `checkpoints` this run wrote (the others are earlier runs' of the same name). */
  checkpoints_this_run?: number | null;
  /** The epoch in progress, from 1 (0 before the first). */
  epoch?: number | null;
  epochs?: number | null;
  step?: number | null;
  steps?: number | null;
  global_step?: number | null;
  metrics?: { [name: string]: number | null } | null;
  history?: IEpochLogs[] | null;
  /** The loss per batch, `[batch, loss]`, batch counted across epochs (at most ~300 points; loss null for a NaN). */
  loss_curve?: [number, number | null][] | null;
  /** What `set` can change, and the current values (null: off, like clipnorm). */
  tunables?: { [name: string]: number | null } | null;
  /** What was steered, oldest first (the last 50). */
  changes?: IChange[] | null;
  events?: IRunEvent[] | null;
  acks?: IAck[] | null;
  error?: string | null;
  /** The kernel the run lives in, if its record names one. */
  kernel_id?: string | null;
  process?: number | null;
  num_processes?: number | null;
  processes?: IProcess[] | null;
  lost_process?: number | null;
  /** How an ended run ended; absent while it runs. */
  end_reason?: EndReason | null;
  /** For end reason `callback`: the class of the callback that ended `fit` early. */
  stopped_by?: string | null;
  // Added by the lister.
  /** False for an ended run of the history, whose process let it go (or is gone). */
  live?: boolean;
  // Added by the server.
  /** True if the run's kernel is one of this server's. */
  kernel_on_this_server?: boolean;
  /** The notebook (session path) of that kernel, if this server knows it. */
  notebook_path?: string | null;
}

/** An answer of the API other than 2xx, or no answer at all. */
export class ApiError extends Error {
  /**
   * @param status - The HTTP status; 0 when the server could not be reached.
   * @param message - The server's `message`, or what went wrong.
   */
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/**
 * Calls the traincontrol API.
 *
 * @param endPoint - The path under `traincontrol/api/`, e.g. `runs`.
 * @param init - The request: method, body.
 * @returns The decoded JSON answer.
 * @throws {ApiError} On a network failure (status 0) or a non-2xx answer,
 *   carrying the server's `message`.
 */
export async function requestAPI<T>(
  endPoint: string,
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'traincontrol', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(0, `Cannot reach the Jupyter server: ${error}`);
  }
  const text = await response.text();
  let data: any = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch (error) {
      data = null;
    }
  }
  if (!response.ok) {
    const message =
      data && typeof data.message === 'string' ? data.message : '';
    throw new ApiError(
      response.status,
      message || `${response.status} ${response.statusText} from ${url}`
    );
  }
  if (data === null) {
    throw new ApiError(
      response.status,
      `Expected JSON from ${url}, got: ${text.slice(0, 80)}`
    );
  }
  return data as T;
}

/**
 * Lists the runs of this user: the live ones, and the ended ones the
 * history keeps (a server without that history ignores `all` and lists the
 * live ones).
 *
 * @throws {ApiError} As `requestAPI`; a 404 here means the server extension
 *   is not enabled, and says so.
 */
export async function fetchRuns(): Promise<IRun[]> {
  try {
    return await requestAPI<IRun[]>('runs?all=true');
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      throw new ApiError(
        404,
        'The jupyter_traincontrol server extension is not enabled on this ' +
          'Jupyter server (GET traincontrol/api/runs answered 404). Install ' +
          'jupyter-traincontrol in the environment that runs the server, or ' +
          'enable it with `jupyter server extension enable jupyter_traincontrol`, ' +
          'then restart the server.'
      );
    }
    throw error;
  }
}

/** Who sends a command through the server: the run's log names it. */
export type Sender = 'side-panel' | 'notebook-panel';

/**
 * Sends a command to the run called `name`; resolves once delivered.
 *
 * @param command - A command word, or a whole command line with its
 *   arguments (`set lr=1e-4`, `rollback 2`).
 * @param sender - Which panel's button sent it (the side panel by default).
 */
export function sendCommand(
  name: string,
  command: Command | string,
  sender: Sender = 'side-panel'
): Promise<{ message: string }> {
  return requestAPI<{ message: string }>(
    `runs/${encodeURIComponent(name)}/commands`,
    { method: 'POST', body: JSON.stringify({ command, sender }) }
  );
}
