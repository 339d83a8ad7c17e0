import { Kernel, KernelMessage } from '@jupyterlab/services';
import { PromiseDelegate, UUID } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { applyDelta } from './delta';
import {
  Action,
  COMM_TARGET,
  ICommand,
  IDeltaMessage,
  IEvent,
  IGroupRequest,
  IReply,
  IState,
  SCHEMA_VERSION
} from './protocol';

/** Kernel statuses after which the kernel's comms are gone. */
const GONE = new Set<Kernel.Status>(['restarting', 'autorestarting', 'dead']);
/** Kernel statuses in which a new comm can be opened. */
const READY = new Set<Kernel.Status>(['idle', 'busy']);
/** Longest wait for the front end's comm subshell before opening without it. */
const SUBSHELL_WAIT_MS = 5000;

/**
 * The `jaxsys` comm of one kernel connection.
 *
 * A kernel restarted in place keeps its id and its connection object, and no
 * kernel-changed signal fires, yet its comms are gone. The link therefore watches the
 * kernel's status and connection and opens a new comm whenever the kernel is ready and
 * has none.
 */
export class KernelLink implements IDisposable {
  constructor(readonly kernel: Kernel.IKernelConnection) {
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.connectionStatusChanged.connect(this._onConnection, this);
    kernel.disposed.connect(() => this.dispose());
    void this._open();
  }

  /** Whether the kernel is a jaxsys kernel (null until its info arrived). */
  get isJaxsys(): boolean | null {
    return this._isJaxsys;
  }

  /** Whether a comm is open and has sent the state. */
  get connected(): boolean {
    return this._comm !== null && !this._comm.isDisposed && this._state !== null;
  }

  /** The latest state the kernel pushed, or null while not connected. */
  get state(): IState | null {
    return this._state;
  }

  /** How many comms this link has opened (a restart opens another). */
  get generation(): number {
    return this._generation;
  }

  /** Emitted on every state push, and when the link connects or drops. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted with every reply to a command. */
  get replied(): ISignal<this, IReply> {
    return this._replied;
  }

  /** Emitted when another surface (`%jaxsys`, the dashboard) carried out a command. */
  get told(): ISignal<this, IEvent> {
    return this._told;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * Send a command; resolves with the kernel's reply.
   *
   * @param action - The action.
   * @param rank - The process, for `kill` and `restart`.
   */
  command(action: Action, rank: number | null = null): Promise<IReply> {
    const comm = this._comm;
    if (!comm || comm.isDisposed) {
      return Promise.reject(new Error('not connected to a jaxsys kernel'));
    }
    const id = UUID.uuid4();
    const pending = new PromiseDelegate<IReply>();
    this._pending.set(id, pending);
    const msg: ICommand = { type: 'command', action, rank, id };
    comm.send(msg as any);
    return pending.promise;
  }

  /**
   * Open one group of a large cluster's summary (null: back to the groups); the kernel
   * answers with that group's rows.
   */
  openGroup(group: number | null): void {
    const comm = this._comm;
    if (comm && !comm.isDisposed) {
      const msg: IGroupRequest = { type: 'group', group };
      comm.send(msg as any);
    }
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._drop();
    Signal.clearData(this);
  }

  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (GONE.has(status)) {
      this._drop();
    } else if (READY.has(status) && !this._opening && !this._hasComm()) {
      void this._open();
    }
  }

  private _onConnection(
    _: Kernel.IKernelConnection,
    status: Kernel.ConnectionStatus
  ): void {
    if (status === 'connected' && !this._opening && !this._hasComm()) {
      void this._open();
    }
  }

  private _hasComm(): boolean {
    return this._comm !== null && !this._comm.isDisposed;
  }

  private async _open(): Promise<void> {
    const kernel = this.kernel;
    if (this._isDisposed || kernel.isDisposed || this._opening) {
      return;
    }
    this._opening = true;
    try {
      const info = await kernel.info;
      this._isJaxsys = info.implementation === 'jaxsys';
      if (!this._isJaxsys || this._isDisposed || this._hasComm()) {
        this._changed.emit();
        return;
      }
      const comm = kernel.createComm(COMM_TARGET);
      comm.onMsg = msg => this._onMsg(comm, msg);
      comm.onClose = () => {
        if (this._comm === comm) {
          this._drop();
        }
      };
      this._comm = comm;
      this._generation += 1;
      // The front end's CommHandler (not the IComm interface) creates a subshell for
      // the comm's target; opened on it, the comm also opens while a cell blocks.
      const started = (comm as { subshellStarted?: Promise<void> }).subshellStarted;
      if (kernel.supportsSubshells && started) {
        await Promise.race([
          started.catch(() => undefined),
          new Promise(resolve => setTimeout(resolve, SUBSHELL_WAIT_MS))
        ]);
      }
      if (!comm.isDisposed) {
        comm.open({ client: 'jaxsys-labextension', v: SCHEMA_VERSION });
      }
    } catch (reason) {
      console.warn('jaxsys: could not open the comm', reason);
    } finally {
      this._opening = false;
    }
  }

  private _onMsg(comm: Kernel.IComm, msg: KernelMessage.ICommMsgMsg): void {
    if (comm !== this._comm) {
      return;
    }
    const data = msg.content.data as any;
    if (data?.type === 'state') {
      this._state = data.state as IState;
      this._version = data.version ?? 0;
      this._refreshing = false;
      this._changed.emit();
    } else if (data?.type === 'delta') {
      const next = applyDelta(this._state, this._version, data as IDeltaMessage);
      if (next === null) {
        // A delta on another version than ours (one was lost): ask for the whole state.
        if (!this._refreshing) {
          this._refreshing = true;
          comm.send({ type: 'refresh' } as any);
        }
        return;
      }
      this._state = next;
      this._version = (data as IDeltaMessage).rows.v;
      this._changed.emit();
    } else if (data?.type === 'event') {
      this._told.emit(data as IEvent);
    } else if (data?.type === 'reply') {
      const reply = data as IReply;
      const pending = this._pending.get(reply.id);
      this._pending.delete(reply.id);
      pending?.resolve(reply);
      this._replied.emit(reply);
    }
  }

  private _drop(): void {
    const comm = this._comm;
    this._comm = null;
    this._state = null;
    this._version = 0;
    this._refreshing = false;
    if (comm && !comm.isDisposed) {
      comm.dispose();
    }
    for (const pending of this._pending.values()) {
      pending.reject(new Error('the kernel went away'));
    }
    this._pending.clear();
    this._changed.emit();
  }

  private _comm: Kernel.IComm | null = null;
  private _state: IState | null = null;
  private _version = 0;
  private _refreshing = false;
  private _isJaxsys: boolean | null = null;
  private _opening = false;
  private _generation = 0;
  private _isDisposed = false;
  private _pending = new Map<string, PromiseDelegate<IReply>>();
  private _changed = new Signal<this, void>(this);
  private _replied = new Signal<this, IReply>(this);
  private _told = new Signal<this, IEvent>(this);
}
