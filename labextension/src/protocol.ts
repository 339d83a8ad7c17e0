/**
 * The messages of the `jaxsys` comm (schema version 1), as the kernel defines them in
 * `jaxsys_kernel/kernel/comm.py`. The dashboard's control buttons send the same
 * `{action, rank}` commands.
 */

/** The comm target the kernel registers. */
export const COMM_TARGET = 'jaxsys';

/** The schema version this front end reads. */
export const SCHEMA_VERSION = 1;

/** Every command the kernel accepts. */
export type Action =
  | 'start'
  | 'stop-cluster'
  | 'interrupt'
  /** The old name of `interrupt`, still accepted. */
  | 'stop'
  | 'stacks'
  | 'kill'
  | 'restart'
  | 'restart-world';

/**
 * The state a process is shown in (`ProcessState` in `jaxsys_kernel/protocol.py`). The
 * cluster is `ready`; each of its processes is `alive` when usable.
 */
export type ProcessState =
  | 'alive'
  | 'stuck'
  | 'dead'
  | 'restarting'
  | 'starting'
  | 'unknown';

/** One process, as the kernel sees it. */
export interface IProcess {
  rank: number;
  host: string;
  pid: number | null;
  devices: number[];
  /** A {@link ProcessState}; typed as a string so that a newer kernel's word still shows. */
  state: string;
  heartbeat_age: number | null;
  busy: boolean;
  /** The world's incarnation this process belongs to (absent from older kernels). */
  incarnation?: number;
  /** Times it was restarted alone since the cluster started (absent from older kernels). */
  restarts?: number;
}

/** Compilation-cache totals over all processes. */
export interface ICache {
  requests: number;
  hits: number;
  hit_rate: number | null;
  compiles: number;
  compile_time: number;
  time_saved: number;
  entries: number;
  bytes: number;
}

/** A running cluster. */
export interface ICluster {
  state: string;
  nprocs: number;
  alive: number;
  devices: number;
  live_devices: number;
  warning: boolean;
  processes: IProcess[];
  cache: ICache | null;
  security: string;
  heartbeat_timeout: number | null;
}

/**
 * The cluster's state in one word, as `%jaxsys status` says it too (one source in the
 * kernel: `jaxsys_kernel/magics/health.py`).
 */
export interface IHealth {
  /** `ready`, `starting`, `restarting`, `out of step`, `degraded` or `stopped`. */
  state: string;
  /** Why, in one sentence (empty when ready). */
  reason: string;
  /** Whether views warn (out of step, degraded). */
  warning: boolean;
}

/** What the kernel pushes. */
export interface IState {
  kernel: { pid: number; version: string };
  cell_running: boolean;
  time: number;
  /** Absent from kernels older than the health field. */
  health?: IHealth;
  cluster: ICluster | null;
  error?: string;
}

/** The kernel's answer to a command. */
export interface IReply {
  type: 'reply';
  id: string;
  action: Action;
  ok: boolean;
  message: string;
  log: string[];
}

/** A command sent to the kernel. */
export interface ICommand {
  type: 'command';
  action: Action;
  rank: number | null;
  id: string;
}
