/**
 * The commands that ask first, in a dialog: Abort (what was learnt since the
 * last checkpoint is lost) and Rollback (what was learnt since the newest
 * checkpoint is undone). One wording for the side panel and the notebook
 * panel's buttons.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';

const QUESTIONS: { [command: string]: { title: string; body: string; label: string } } = {
  abort: {
    title: 'Abort {name}?',
    body:
      'Training ends without a checkpoint: what was learnt since the ' +
      'last checkpoint is lost. Stop instead writes a checkpoint first.',
    label: 'Abort'
  },
  rollback: {
    title: 'Roll back {name}?',
    body:
      'The newest checkpoint is loaded into the live model and optimizer, and ' +
      'training goes on from there: what was learnt since it is undone. ' +
      "A learning rate you set stays; otherwise the checkpoint's comes back.",
    label: 'Roll back'
  }
};

/** True for a command that asks before it is sent. */
export function asksFirst(command: string): boolean {
  return command in QUESTIONS;
}

/**
 * Asks whether to send `command` to the run `name`.
 *
 * @returns True if the user confirmed, or if `command` does not ask.
 */
export async function confirmCommand(name: string, command: string): Promise<boolean> {
  const question = QUESTIONS[command];
  if (!question) {
    return true;
  }
  const result = await showDialog({
    title: question.title.replace('{name}', name),
    body: question.body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: question.label })]
  });
  return result.button.accept;
}
