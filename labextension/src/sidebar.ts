// The GPU sidebar: every GPU of the node with a used/free bar (JAX's pools marked), every
// process on it (user, notebook, mode, bytes, idle), the warnings, and a shut-down button, with
// a confirmation, where the notebook panel has one: for each kernel a blocking-preallocation
// warning names that the server offers (its shutdown_offer: this user's kernel, through the
// path `%jaxmem shutdown` takes), or the reason it cannot; never for a harmless kernel in its
// place. Another user's notebook is shown, never opened.
import { Widget } from '@lumino/widgets';

import { IGpu, IKernel, IProcess, IShutdownOffer, IStatus } from './api';
import { duration, element, gib, gpuLabel, mode, owner, poolsText, where } from './format';
import { IGpuStatus } from './model';

export const SIDEBAR_ID = 'jax-nbmem-sidebar';

export class GpuSidebar extends Widget {
  constructor(
    private _model: IGpuStatus,
    private _openNotebook: (path: string) => void
  ) {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('jax-nbmem-sidebar');
    this.title.caption = 'GPU memory (jax_nbmem)';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU memory');
    this.node.append(element('h2', 'GPU memory'), this._message, this._gpus, this._warnings);
    this._message.setAttribute('role', 'status');
    _model.changed.connect(this._render, this);
    this._render();
  }

  private _render(): void {
    if (this._confirming) {
      return; // a confirmation on screen is not redrawn away
    }
    const status = this._model.status;
    if (!this._model.available) {
      this.dispose(); // no server extension: nothing to show (the console said why)
      return;
    }
    if (!status) {
      this._gpus.replaceChildren(element('p', this._model.problem || 'waiting for the server…'));
      return;
    }
    this._warnings.replaceChildren(
      ...(status.warnings || []).map(w =>
        element('div', `${w.kind}: ${w.message}`, { class: 'jax-nbmem-warning' })
      )
    );
    if (!status.nvml.available) {
      const why = status.nvml.reason || 'NVML is unavailable';
      this._gpus.replaceChildren(element('p', `No GPU seen: ${why}.`));
      return;
    }
    this._gpus.replaceChildren(...status.gpus.map(gpu => this._gpu(gpu, status)));
  }

  private _gpu(gpu: IGpu, status: IStatus): HTMLElement {
    const section = element('section', null, {
      class: 'jax-nbmem-gpu',
      'aria-label': gpuLabel(gpu, gpu.index)
    });
    const on = (status.processes || [])
      .filter(p => p.gpu === gpu.index)
      .sort((a, b) => (b.used_bytes || 0) - (a.used_bytes || 0));
    // A GPU in MIG mode has its processes, and their pools, under its instances.
    const pools = gpu.mig_mode ? { bytes: null, text: '' } : poolsText(on);
    section.append(
      element('h3', `${gpuLabel(gpu, gpu.index)}: ${gpu.name || 'name unknown'}`),
      bar(gpu, pools.bytes, pools.text),
      element(
        'div',
        `${gib(gpu.used_bytes)} used${pools.text ? ` (${pools.text})` : ''} · ` +
          `${gib(gpu.free_bytes)} free of ${gib(gpu.total_bytes)}`,
        { class: 'jax-nbmem-note' }
      )
    );
    if (gpu.problem) {
      section.append(element('div', gpu.problem, { class: 'jax-nbmem-note' }));
    }
    const own = new Map((status.kernels || []).map(k => [k.kernel_id, k]));
    const list = element('ul', null, { class: 'jax-nbmem-processes' });
    for (const process of on) {
      list.append(this._process(process, own));
    }
    if (gpu.mig_mode) {
      // its processes are its instances', each of which is shown as a GPU of its own
      list.append(
        element('li', 'in MIG mode: its processes are listed under its instances', {
          class: 'jax-nbmem-note'
        })
      );
    } else if (!on.length) {
      list.append(element('li', 'no processes', { class: 'jax-nbmem-note' }));
    }
    section.append(list);
    return section;
  }

  private _process(process: IProcess, own: Map<string, IKernel>): HTMLElement {
    const kernel = process.kernel_id ? own.get(process.kernel_id) : undefined;
    const mine = !!kernel;
    const item = element('li', null, { class: mine ? 'jax-nbmem-mine' : '' });
    const shown = process.notebook_shown || process.notebook || process.cmdline || '';
    const name = `${process.kind} PID ${process.pid}`;
    const head = element('div', null, { class: 'jax-nbmem-row' });
    if (kernel && kernel.notebook) {
      // This server's path of the user's own notebook: a click opens it.
      const path = kernel.notebook;
      const link = element('button', path, {
        class: 'jax-nbmem-link',
        type: 'button',
        title: `Open ${path}`
      });
      link.addEventListener('click', () => this._openNotebook(path));
      head.append(link);
    } else {
      head.append(element('span', shown || name, { class: 'jax-nbmem-name' }));
    }
    head.append(element('span', gib(process.used_bytes), { class: 'jax-nbmem-bytes' }));
    const details = [
      name,
      owner(process),
      mode(process) ? `mode ${mode(process)}` : '',
      process.idle_s !== null && process.idle_s !== undefined
        ? `idle ${duration(process.idle_s)}`
        : ''
    ].filter(Boolean);
    item.append(
      head,
      element('div', details.join(' · '), {
        class: 'jax-nbmem-note',
        ...(process.mode_reason ? { title: `chosen by auto: ${process.mode_reason}` } : {})
      })
    );
    if (where(process)) {
      item.append(
        element('div', where(process), { class: 'jax-nbmem-note jax-nbmem-container' })
      );
    }
    const offer = process.shutdown_offer;
    if (offer && offer.offered) {
      item.append(this._shutdown(process, offer));
    } else if (offer) {
      item.append(
        element('div', `Not shut down from here: ${offer.why}`, {
          class: 'jax-nbmem-note jax-nbmem-refusal'
        })
      );
    }
    return item;
  }

  private _shutdown(process: IProcess, offer: IShutdownOffer): HTMLElement {
    const cell = element('div', null, { class: 'jax-nbmem-actions' });
    const shown = process.notebook_shown || process.notebook;
    const name = shown ? ` (${shown.split('/').pop()})` : '';
    const ask = element('button', `Shut down PID ${process.pid}${name}`, {
      type: 'button',
      title: offer.why
    });
    ask.addEventListener('click', () => {
      this._confirming = true;
      const confirm = element('button', `Confirm: shut down PID ${process.pid}`, {
        type: 'button',
        class: 'jax-nbmem-danger'
      });
      const cancel = element('button', 'Cancel', { type: 'button' });
      confirm.addEventListener('click', async () => {
        cell.replaceChildren(element('span', `Stopping kernel PID ${process.pid}…`));
        const outcome = await this._model.shutdownProcess(process.pid);
        this._confirming = false;
        this._message.textContent = outcome.done
          ? outcome.message || `Stopped kernel PID ${process.pid}.`
          : `Could not stop kernel PID ${process.pid}: ${outcome.message}`;
        this._render();
      });
      cancel.addEventListener('click', () => {
        this._confirming = false;
        this._render();
      });
      cell.replaceChildren(confirm, cancel);
    });
    cell.append(ask);
    return cell;
  }

  private _confirming = false;
  private _message = element('p', null, { class: 'jax-nbmem-message' });
  private _warnings = element('div', null, { class: 'jax-nbmem-warnings' });
  private _gpus = element('div');
}

/** The used/free bar: JAX's pools (hatched; what is measured of them), other memory in use,
 * then what is free. */
function bar(gpu: IGpu, measured: number | null, pools: string): HTMLElement {
  const total = gpu.total_bytes || 0;
  const used = gpu.used_bytes || 0;
  const share = (bytes: number) => `${total ? Math.min(100, (100 * bytes) / total) : 0}%`;
  const node = element('div', null, {
    class: 'jax-nbmem-bar',
    role: 'img',
    'aria-label': `${gib(used)} of ${gib(total)} used${pools ? ` (${pools})` : ''}`
  });
  const poolBytes = measured || 0; // the hatched part: only what is measured
  const pool = element('div', null, { class: 'jax-nbmem-bar-pool', title: 'JAX pools' });
  pool.style.width = share(Math.min(poolBytes, used));
  const rest = element('div', null, { class: 'jax-nbmem-bar-used', title: 'other memory in use' });
  rest.style.width = share(Math.max(0, used - poolBytes));
  node.append(pool, rest);
  return node;
}
