// The server extension's API as the JupyterLab face reads it: the status snapshot and the
// shutdown of one of this server's kernels. Every request goes through ServerConnection with
// the server's settings, which carries the token and the XSRF header (behind JupyterHub too)
// and resolves the base URL.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IGpu {
  index: number;
  uuid: string | null;
  name: string | null;
  label?: string | null; // 'GPU 0', or 'MIG 3g.71gb instance 1 of GPU 0' for a MIG instance
  mig_mode?: boolean;
  total_bytes: number | null;
  used_bytes: number | null;
  free_bytes: number | null;
  ours: boolean;
  problem: string | null;
}

/** A process's container as the host sees it; pod and namespace null off Kubernetes or where
 * the node agent may not show them to this user. */
export interface IContainer {
  name: string | null;
  id: string | null;
  pod: string | null;
  namespace: string | null;
}

export interface IProcess {
  pid: number;
  pid_in_container?: number | null; // its PID in its container; null on the host
  container?: IContainer | null; // null on the host itself
  container_shown?: string | null; // 'container notebook in pod jhub/jupyter-alice'; null: none
  gpu: number;
  used_bytes: number | null;
  kind: string;
  notebook: string | null;
  notebook_shown: string | null;
  preallocated: boolean | null;
  user: string | null;
  user_shown?: string | null; // 'jovyan in its container': the status line's words for user
  user_source?: string | null; // null: the host's account; 'container', 'uid', 'host_uid'
  hub_user: string | null;
  cmdline: string | null;
  kernel_id: string | null;
  idle_s: number | null;
  mode: string | null;
  mode_at_start: string | null;
  mode_reason: string | null;
  runs_jax?: boolean | null; // false: it has no JAX pool at all; null: not known
  jax: { pool_bytes?: number | null } | null;
  // Set for each process a blocking-preallocation warning names: whether the sidebar offers to
  // shut it down (the panel's offer, decided by the server), how, and why (or why not).
  shutdown_offer?: IShutdownOffer | null;
}

export interface IShutdownOffer {
  offered: boolean;
  how: 'this server' | 'server' | 'signal' | null;
  why: string;
}

export interface IWarning {
  kind: string;
  gpu: number | null;
  pid: number | null;
  message: string;
}

export type KernelState = 'normal' | 'shared-preallocation' | 'blocking' | 'will-not-fit';

export interface IKernel {
  kernel_id: string;
  notebook: string | null;
  pid: number | null;
  idle_s: number | null;
  gpus: number[];
  gpu_memory_bytes: number | null;
  mode: string | null;
  mode_shown?: string | null;
  preallocated: boolean | null;
  state?: KernelState;
  state_reason?: string | null;
  warnings?: IWarning[];
}

export interface IStatus {
  nvml: { available: boolean; reason: string | null };
  gpus: IGpu[];
  processes: IProcess[];
  warnings: IWarning[];
  kernels: IKernel[];
  server: { age_s?: number; problem?: string | null };
}

/** What one look at the API found. */
export type Reply =
  | { kind: 'ok'; status: IStatus }
  | { kind: 'starting' } // 503: the server's first snapshot is on its way
  | { kind: 'absent'; why: string } // no server extension on this server
  | { kind: 'failed'; why: string };

const settings = ServerConnection.makeSettings();

function url(path: string): string {
  return URLExt.join(settings.baseUrl, 'jax-nbmem', 'api', path);
}

/** GET the status snapshot: one request for everything the item and the sidebar show. */
export async function fetchStatus(): Promise<Reply> {
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url('status'), { cache: 'no-store' }, settings);
  } catch (error) {
    return { kind: 'failed', why: `cannot reach the server: ${String(error)}` };
  }
  if (response.status === 503) {
    return { kind: 'starting' };
  }
  if (response.status === 404) {
    return {
      kind: 'absent',
      why:
        `${url('status')} answered 404: the jax_nbmem server extension is not enabled in ` +
        'this Jupyter server (see `jupyter server extension list`)'
    };
  }
  if (response.status === 403) {
    return { kind: 'failed', why: 'status 403: not logged in, or the login expired' };
  }
  if (!response.ok) {
    return { kind: 'failed', why: `status ${response.status}` };
  }
  return { kind: 'ok', status: (await response.json()) as IStatus };
}

/** Shut down a process the server offers (shutdown_offer); resolves to what happened. */
export async function shutdownProcess(pid: number): Promise<{ done: boolean; message: string }> {
  try {
    const response = await ServerConnection.makeRequest(
      url(`processes/${encodeURIComponent(String(pid))}/shutdown`),
      { method: 'POST' },
      settings
    );
    const body = await response.json().catch(() => ({}));
    if (response.ok) {
      return { done: !!body.done, message: String(body.message || '') };
    }
    return { done: false, message: `status ${response.status} ${body.message || ''}`.trim() };
  } catch (error) {
    return { done: false, message: String(error) };
  }
}

/** Shut down one of this server's kernels; resolves to an error text, or null when done. */
export async function shutdownKernel(kernelId: string): Promise<string | null> {
  try {
    const response = await ServerConnection.makeRequest(
      url(`kernels/${encodeURIComponent(kernelId)}/shutdown`),
      { method: 'POST' },
      settings
    );
    if (response.ok) {
      return null;
    }
    const body = await response.json().catch(() => ({}));
    return `status ${response.status} ${body.message || ''}`.trim();
  } catch (error) {
    return String(error);
  }
}
