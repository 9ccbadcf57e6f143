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

/** The hub's user name where there is one (in container hubs every Unix user is `jovyan`). */
export function owner(process: IProcess): string {
  const hub = process.hub_user;
  if (hub && hub !== process.user) {
    return process.user ? `${hub} (Unix user ${process.user})` : hub;
  }
  return process.user || '';
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
