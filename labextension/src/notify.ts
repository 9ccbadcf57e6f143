// A notification when one of this server's kernels (this user's) starts blocking others:
// once per kernel and GPU, remembered across page reloads, with "Shut down kernel" and
// "Open notebook". Uses JupyterLab's notification centre (JupyterLab >= 4.1, Notebook 7).
import { Notification } from '@jupyterlab/apputils';

import { IStatus } from './api';
import { gib, gpuLabel } from './format';
import { IGpuStatus } from './model';

const REMEMBERED = 'jax_nbmem:notified';
const KEEP = 200; // keys remembered; the oldest are forgotten first

/** The (kernel, GPU) pairs that block others in this snapshot, keyed "kernel_id:gpu". */
interface IBlocking {
  path: string | null;
  id: string;
  text: string;
}

export function blockingKernels(status: IStatus): Map<string, IBlocking> {
  const found = new Map<string, IBlocking>();
  for (const kernel of status.kernels || []) {
    for (const warning of kernel.warnings || []) {
      if (warning.kind !== 'blocking-preallocation' || warning.gpu === null) {
        continue;
      }
      const where = kernel.notebook ? `Your kernel of ${kernel.notebook}` : 'Your kernel';
      const gpu = (status.gpus || []).find(g => g.index === warning.gpu);
      const text =
        `${where} holds ${gib(kernel.gpu_memory_bytes)} of ${gpuLabel(gpu, warning.gpu)} and keeps ` +
        `others off it: ${gib(gpu ? gpu.free_bytes : null)} is free. Shut it down, or ` +
        'restart it with `%jaxalloc off` in its first cell.';
      found.set(`${kernel.kernel_id}:${warning.gpu}`, {
        path: kernel.notebook,
        id: kernel.kernel_id,
        text
      });
    }
  }
  return found;
}

export class BlockingNotifier {
  constructor(
    private _model: IGpuStatus,
    private _openNotebook: (path: string) => void
  ) {
    _model.changed.connect(this._check, this);
  }

  private _check(): void {
    const status = this._model.status;
    if (!status) {
      return;
    }
    const told = remembered();
    for (const [key, kernel] of blockingKernels(status)) {
      if (told.includes(key)) {
        continue;
      }
      told.push(key);
      const actions: Notification.IAction[] = [
        {
          label: 'Shut down kernel',
          displayType: 'warn',
          callback: () => void this._model.shutdown(kernel.id)
        }
      ];
      if (kernel.path) {
        const path = kernel.path;
        actions.push({ label: 'Open notebook', callback: () => this._openNotebook(path) });
      }
      Notification.warning(kernel.text, { autoClose: false, actions });
    }
    remember(told);
  }
}

function remembered(): string[] {
  try {
    return JSON.parse(window.localStorage.getItem(REMEMBERED) || '[]');
  } catch {
    return [];
  }
}

function remember(keys: string[]): void {
  try {
    window.localStorage.setItem(REMEMBERED, JSON.stringify(keys.slice(-KEEP)));
  } catch {
    // storage full or refused: the next reload may tell again, nothing worse
  }
}
