/**
 * The messages of the `jaxsys` comm (schema version 2), as the kernel declares them in
 * `jaxsys_kernel/protocol.py` (a unit test compares the two). The dashboard's control
 * buttons send the same `{action, rank}` commands.
 *
 * The kernel sends the whole state when the comm opens (and on `refresh`), then `delta`
 * messages: the state without rows and summary, the rows changed since a version, and the
 * summary only when it changed.
 */

/** The comm target the kernel registers. */
export const COMM_TARGET = 'jaxsys';

/** The schema version this front end reads. */
export const SCHEMA_VERSION = 2;

/** What the kernel sends. */
export type KernelMessage = 'state' | 'delta' | 'reply' | 'event';

/** What the front end sends. */
export type FrontEndMessage = 'command' | 'refresh' | 'group';

/**
 * Every command the kernel accepts: the commands its registry
 * (`jaxsys_kernel/magics/commands.py`) offers on the comm, then their old names. `restart`
 * with a rank replaces that process; without one, the whole JAX world.
 */
export type Action =
  | 'start'
  | 'stop-cluster'
  | 'interrupt'
  /** The old name of `interrupt`, still accepted. */
  | 'stop'
  | 'stacks'
  | 'kill'
  | 'restart'
  /** The old name of `restart` without a rank, still accepted. */
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
  /** Why the process died, as the cluster recorded it (null while it runs). */
  error?: string | null;
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

/** One group of consecutive ranks in a summary. */
export interface IGroup {
  group: number;
  /** The ranks, as `0-31`. */
  ranks: string;
  /** The host, or `N hosts`. */
  hosts: string;
  /** Processes by state. */
  states: Record<string, number>;
  /** The most alarming state in the group. */
  worst: string;
  busy: number;
  /** Whole seconds of the oldest heartbeat, 0 while fresh (null: none yet). */
  oldest_heartbeat: number | null;
}

/** A cluster above the group size: counts, groups and shared errors. */
export interface ISummary {
  by_state: Record<string, number>;
  group_size: number;
  groups: IGroup[];
  errors: { error: string; count: number; ranks: string }[];
}

/** The rows of a `delta` message: what changed since version `base`. */
export interface IRowDelta {
  /** The rows' version after this delta. */
  v: number;
  /** The version it applies to; another one held means: send `refresh`. */
  base: number;
  /** Changed rows by rank, without the heartbeat age. */
  rows: Record<string, Partial<IProcess>>;
  /** Ranks no longer shown. */
  gone: number[];
  /** The heartbeat age of every row shown, by rank. */
  ages: Record<string, number | null>;
}

/** A running cluster. */
export interface ICluster {
  state: string;
  nprocs: number;
  alive: number;
  devices: number;
  live_devices: number;
  warning: boolean;
  /** Every process up to the group size, else those of the open `group`. */
  processes: IProcess[];
  /** Null up to the group size. */
  summary?: ISummary | null;
  /** The group whose rows are sent (null: none open). */
  group?: number | null;
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

/** The whole state, and the version of its rows. */
export interface IStateMessage {
  type: 'state';
  v: number;
  state: IState;
  version?: number;
}

/** What changed since the last message. */
export interface IDeltaMessage {
  type: 'delta';
  v: number;
  /** The state without `cluster.processes` and `cluster.summary`. */
  state: IState;
  rows: IRowDelta;
  /** Present only when it changed. */
  summary?: ISummary | null;
}

/** Opens one group of the summary (null closes it). */
export interface IGroupRequest {
  type: 'group';
  group: number | null;
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

/**
 * A command another surface carried out (`%jaxsys` in a cell, the dashboard's buttons), so
 * that the sidebar's log shows every action; the sidebar's own commands get an
 * {@link IReply} instead.
 */
export interface IEvent {
  type: 'event';
  /** `jaxsys` (the magic) or `dashboard`. */
  surface: string;
  /** The registry's name of the command (a newer kernel's may be none of {@link Action}). */
  action: string;
  rank: number | null;
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
