// How figures and people are written, as the board writes them.
import { IGpu, IKernel, IProcess, IStatus } from './api';

export function gib(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '—';
  }
  return bytes >= 2 ** 30
    ? `${(bytes / 2 ** 30).toFixed(1)} GiB`
    : `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '—';
  }
  if (seconds < 90) {
    return `${Math.round(seconds)} s`;
  }
  return seconds < 5400
    ? `${Math.round(seconds / 60)} min`
    : `${(seconds / 3600).toFixed(1)} h`;
}

/** How a GPU is named, as the board names it: a MIG instance is a GPU of its own. */
export function gpuLabel(gpu: IGpu | undefined, index: number | null): string {
  return (gpu && gpu.label) || `GPU ${gpu ? gpu.index : index}`;
}

/** Whether a GPU is the simulated one (jax_nbmem.simgpu): its name says so, as everywhere. */
export function simulated(gpu: IGpu | undefined): boolean {
  return !!gpu && /\(simulated\)/i.test(gpu.name || '');
}

/** JAX's pool in a process: its own account, all it holds when it preallocated, 0 when it
 * runs no JAX; null when nothing measured it (never a guessed 0). */
export function poolBytes(process: IProcess): number | null {
  const pool = process.jax?.pool_bytes;
  if (pool !== null && pool !== undefined) {
    return pool;
  }
  if (process.preallocated) {
    return process.used_bytes ?? null;
  }
  return process.runs_jax === false ? 0 : null;
}

/** What the processes' JAX pools add up to: "1.2 GiB in JAX pools", "at least …" where some
 * are unmeasured, "JAX pools: —" where none is. */
export function poolsText(processes: IProcess[]): { bytes: number | null; text: string } {
  const pools = processes.map(poolBytes);
  const known = pools.filter((b): b is number => b !== null);
  if (processes.length && !known.length) {
    return { bytes: null, text: 'JAX pools: —' };
  }
  const bytes = known.reduce((sum, b) => sum + b, 0);
  const some = known.length < pools.length ? 'at least ' : '';
  return { bytes, text: `${some}${gib(bytes)} in JAX pools` };
}

/** The hub's user name where there is one (in container hubs every Unix user is `jovyan`).
 * A process in a container is named by its container's user (`jovyan in its container`),
 * never by the host's account of the same uid: the server's `user_shown`. */
export function owner(process: IProcess): string {
  const hub = process.hub_user;
  const unix = process.user_shown || process.user;
  if (hub && (hub !== process.user || process.user_source)) {
    return unix ? `${hub} (Unix user ${unix})` : hub;
  }
  return unix || '';
}

/** Where a process runs when it is in a container, in the status line's words (the server's
 * `container_shown`), with its PID there; '' on the host itself. */
export function where(process: IProcess): string {
  const shown = process.container_shown;
  if (!shown) {
    return '';
  }
  const inner = process.pid_in_container;
  return inner === null || inner === undefined ? shown : `${shown} (PID ${inner} there)`;
}

/** Its allocator mode as the board shows it; empty when no source tells it. */
export function mode(process: IProcess): string {
  return process.mode || process.mode_at_start || (process.preallocated ? 'preallocated' : '');
}

/** This server's kernel with id `kernelId` in the snapshot, if it is there. */
export function kernelOf(status: IStatus, kernelId: string | undefined): IKernel | undefined {
  return kernelId ? (status.kernels || []).find(k => k.kernel_id === kernelId) : undefined;
}

export function element(
  tag: string,
  text?: string | number | null,
  attributes: Record<string, string> = {}
): HTMLElement {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) {
    node.textContent = String(text); // other people's text goes in as text, never as HTML
  }
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  return node;
}
