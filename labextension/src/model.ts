// One poll of the server's status for the whole browser tab: the status-bar item, the sidebar
// and the notifications all read the same snapshot, so a tab with many notebooks open makes one
// request every few seconds. The poll stands by while the tab is hidden.
import { PromiseDelegate, Token } from '@lumino/coreutils';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { IStatus, fetchStatus, shutdownKernel, shutdownProcess } from './api';

/** Milliseconds between two looks at the server's snapshot (the server refreshes every 2 s). */
export const REFRESH_MS = 3000;
/** With no GPU on the node, look again only this seldom. */
export const NO_GPU_REFRESH_MS = 60000;

export const IGpuStatus = new Token<IGpuStatus>('jax_nbmem:IGpuStatus');

export interface IGpuStatus {
  /** The last snapshot; null before the first one, or without the server extension. */
  readonly status: IStatus | null;
  /** Why there is no snapshot (starting, failed); null when there is one. */
  readonly problem: string | null;
  /** False once the server said it has no jax_nbmem extension: then nothing is shown. */
  readonly available: boolean;
  readonly changed: ISignal<IGpuStatus, void>;
  /** Resolves once the server has answered (or failed to) for the first time. */
  readonly ready: Promise<void>;
  /** Look now (after a shutdown), instead of at the next tick. */
  refresh(): Promise<void>;
  shutdown(kernelId: string): Promise<string | null>;
  /** Shut down a process the server offers to (its shutdown_offer), then look again. */
  shutdownProcess(pid: number): Promise<{ done: boolean; message: string }>;
}

export class GpuStatus implements IGpuStatus {
  /**
   * Polls once *wanted* says yes: a page with notebooks to follow (JupyterLab, Notebook 7).
   * Elsewhere (Voilà) it never asks the server, which has no jax_nbmem there to answer.
   */
  constructor(wanted: Promise<boolean> = Promise.resolve(true)) {
    this._poll = new Poll({
      auto: false,
      factory: () => this._look(),
      frequency: { interval: REFRESH_MS, backoff: true, max: 60000 },
      linger: 0, // no look once the tab is hidden
      name: 'jax_nbmem:status',
      standby: 'when-hidden'
    });
    void wanted.then(yes => {
      if (yes) {
        void this._poll.start();
      } else {
        this._poll.dispose();
        this._available = false; // nothing will be shown
        this._ready.resolve();
      }
    });
  }

  get status(): IStatus | null {
    return this._status;
  }

  get problem(): string | null {
    return this._problem;
  }

  get available(): boolean {
    return this._available;
  }

  get changed(): ISignal<IGpuStatus, void> {
    return this._changed;
  }

  get ready(): Promise<void> {
    return this._ready.promise;
  }

  async refresh(): Promise<void> {
    if (this._poll.isDisposed) {
      return;
    }
    try {
      await this._poll.refresh();
      await this._poll.tick;
    } catch {
      // a failed look is said in `problem`; a poll disposed meanwhile has nothing to say
    }
  }

  async shutdown(kernelId: string): Promise<string | null> {
    const failed = await shutdownKernel(kernelId);
    await this.refresh();
    return failed;
  }

  async shutdownProcess(pid: number): Promise<{ done: boolean; message: string }> {
    const outcome = await shutdownProcess(pid);
    await this.refresh();
    return outcome;
  }

  private async _look(): Promise<void> {
    const reply = await fetchStatus();
    this._ready.resolve();
    switch (reply.kind) {
      case 'ok':
        this._status = reply.status;
        this._problem = null;
        this._slowDownWithoutGpu(reply.status);
        break;
      case 'starting':
        this._problem = 'taking the first snapshot…';
        break;
      case 'absent':
        // Said once in the console; the item and the sidebar show nothing.
        console.warn(`jax_nbmem: ${reply.why}; the GPU item and sidebar stay empty`);
        this._available = false;
        this._status = null;
        this._changed.emit();
        setTimeout(() => this._poll.dispose()); // once this look is over: no more looks
        return;
      case 'failed':
        this._problem = reply.why;
        this._changed.emit();
        throw new Error(reply.why); // the poll backs off while the server does not answer
    }
    this._changed.emit();
  }

  private _slowDownWithoutGpu(status: IStatus): void {
    const interval = status.nvml.available ? REFRESH_MS : NO_GPU_REFRESH_MS;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { ...this._poll.frequency, interval };
    }
  }

  private _poll: Poll;
  private _status: IStatus | null = null;
  private _problem: string | null = null;
  private _available = true;
  private _changed = new Signal<IGpuStatus, void>(this);
  private _ready = new PromiseDelegate<void>();
}
