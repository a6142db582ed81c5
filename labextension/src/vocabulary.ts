/**
 * The command vocabulary as the server states it (`GET commands`): what
 * each command does, and which commands make sense in which state. The
 * Python package keeps the one table (`jupyter_traincontrol.commands`); the
 * side panel shows its help as tooltips and enables buttons by it.
 */
import { Command, IRun, requestAPI } from './api';

interface IVocabulary {
  commands: { name: Command; help: string }[];
  allowed: { [state: string]: Command[] };
}

const help = new Map<string, string>();
let allowed: { [state: string]: Command[] } = {};

/** Loads the vocabulary once; until then (or without it) tooltips are empty. */
export async function loadVocabulary(): Promise<void> {
  const vocabulary = await requestAPI<IVocabulary>('commands');
  for (const command of vocabulary.commands) {
    help.set(command.name, command.help.charAt(0).toUpperCase() + command.help.slice(1));
  }
  allowed = vocabulary.allowed;
}

/** What `command` does, in one line (a tooltip). */
export function helpFor(command: Command): string {
  return help.get(command) ?? '';
}

/** The commands that make sense for `run` now: its record says (newer
 * servers), or the vocabulary's table for its state. */
export function allowedFor(run: IRun): Command[] {
  return run.commands ?? allowed[run.state] ?? [];
}
