// The status-bar item: the current notebook's kernel on the GPU, the GPU's free memory, JAX's
// mode, and a colour for its state (amber: preallocated on a shared GPU; red: it blocks
// others). A simulated GPU says so, as its name does in the panel, sidebar and board. A click
// opens the GPU sidebar.
// A type only: the token comes from the page at run time (index.ts), where a page has it.
import type { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { IGpu, IStatus } from './api';
import { gib, gpuLabel, kernelOf, simulated } from './format';
import { IGpuStatus } from './model';

/** What the item says and its colour, for one kernel in one snapshot. */
export interface IItemView {
  text: string;
  state: 'normal' | 'amber' | 'red' | 'none';
  title: string;
}

const COLOURS: Record<string, IItemView['state']> = {
  normal: 'normal',
  'shared-preallocation': 'amber',
  blocking: 'red',
  'will-not-fit': 'red'
};

export function itemView(status: IStatus, kernelId: string | undefined): IItemView {
  if (!status.nvml.available) {
    const why = status.nvml.reason || 'NVML is unavailable';
    return { text: 'GPU: none', state: 'none', title: `No GPU seen: ${why}` };
  }
  const kernel = kernelOf(status, kernelId);
  const gpus = status.gpus.filter(g => g.ours);
  if (!kernel) {
    const gpu = gpus[0] || status.gpus[0];
    const text = gpu ? `${free(gpu)} · no kernel` : 'GPU: no kernel';
    const title = [...simulatedNote(gpu ? [gpu] : []), 'This notebook has no running kernel.'];
    return { text, state: 'normal', title: title.join('\n\n') };
  }
  const state = COLOURS[kernel.state || 'normal'] || 'normal';
  const mode = kernel.mode_shown || kernel.mode || 'JAX not on a GPU';
  const on = kernel.gpus.length ? kernel.gpus : [];
  const where = status.gpus.filter(g => on.includes(g.index));
  const parts = where.length
    ? where.map(
        g => `${label(g)}: ${gib(kernel.gpu_memory_bytes)} · ${gib(g.free_bytes)} free`
      )
    : [gpus[0] ? free(gpus[0]) : 'GPU'];
  const lines = [
    ...simulatedNote(where.length ? where : gpus.slice(0, 1)),
    kernel.state_reason || 'This kernel blocks no one.',
    ...(kernel.warnings || []).map(w => `${w.kind}: ${w.message}`),
    'Click for the GPU sidebar.'
  ];
  return { text: `${parts.join(' | ')} · ${mode}`, state, title: lines.join('\n\n') };
}

function free(gpu: IGpu): string {
  return `${label(gpu)}: ${gib(gpu.free_bytes)} free`;
}

/** "GPU 0", or "GPU 0 (simulated)" on the simulated GPU. */
function label(gpu: IGpu): string {
  return gpuLabel(gpu, gpu.index) + (simulated(gpu) ? ' (simulated)' : '');
}

function simulatedNote(gpus: IGpu[]): string[] {
  return gpus
    .filter(simulated)
    .map(g => `${gpuLabel(g, g.index)} is simulated (${g.name}): its figures come from the simulation, not from hardware.`);
}

export class GpuStatusItem extends Widget {
  constructor(
    private _model: IGpuStatus,
    private _tracker: INotebookTracker,
    private _open: () => void
  ) {
    super({ node: document.createElement('button') });
    this.addClass('jax-nbmem-item');
    this.node.setAttribute('type', 'button');
    this.node.addEventListener('click', () => this._open());
    _model.changed.connect(this._update, this);
    _tracker.currentChanged.connect(this._follow, this);
    this._follow();
  }

  /** Whether the item shows: only with the server extension and a notebook to speak of. */
  get shown(): boolean {
    return this._model.available && !!this._tracker.currentWidget;
  }

  private _follow(): void {
    const panel = this._tracker.currentWidget;
    if (panel) {
      panel.sessionContext.kernelChanged.connect(this._update, this);
      panel.sessionContext.statusChanged.connect(this._update, this);
    }
    this._update();
  }

  private _update(): void {
    const status = this._model.status;
    const node = this.node;
    if (!status) {
      node.textContent = this._model.problem ? 'GPU: …' : '';
      node.title = this._model.problem || '';
      node.dataset.state = 'none';
      return;
    }
    const kernel = this._tracker.currentWidget?.sessionContext.session?.kernel;
    const view = itemView(status, kernel?.id);
    node.textContent = view.text;
    node.title = view.title;
    node.dataset.state = view.state;
    node.setAttribute('aria-label', `${view.text}, state ${view.state}`);
  }
}
