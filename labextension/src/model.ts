import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { stateCounts } from './delta';
import { KernelLink } from './link';
import { Action, IEvent, IHealth, IProcess, IReply, IState } from './protocol';

/**
 * The jaxsys kernel of the current notebook, for the status item, sidebar and commands.
 *
 * Follows the notebook tracker (the last notebook that had focus) and that notebook's
 * kernel changes; keeps one {@link KernelLink} per kernel connection.
 */
export class JaxsysModel {
  constructor(private _tracker: INotebookTracker) {
    _tracker.currentChanged.connect(this._onCurrent, this);
    this._onCurrent();
  }

  /** The link of the current notebook's kernel, if it has one. */
  get link(): KernelLink | null {
    return this._link;
  }

  /** The current notebook, if any. */
  get panel(): NotebookPanel | null {
    return this._panel;
  }

  /** Whether the current notebook runs a jaxsys kernel. */
  get active(): boolean {
    return this._link?.isJaxsys === true;
  }

  /** The latest state of the current kernel, or null. */
  get state(): IState | null {
    return this._link?.state ?? null;
  }

  /** Emitted when the current link changes or pushes a state. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted when {@link active} may have changed. */
  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  /** Emitted with every reply of the current kernel. */
  get replied(): ISignal<this, IReply> {
    return this._replied;
  }

  /** Emitted with every command another surface of the current kernel carried out. */
  get told(): ISignal<this, IEvent> {
    return this._told;
  }

  /** Send a command to the current kernel. */
  command(action: Action, rank: number | null = null): Promise<IReply> {
    if (!this._link) {
      return Promise.reject(new Error('no notebook with a jaxsys kernel'));
    }
    return this._link.command(action, rank);
  }

  /** Open one group of the current kernel's summary (null: back to the groups). */
  openGroup(group: number | null): void {
    this._link?.openGroup(group);
  }

  private _onCurrent(): void {
    const panel = this._tracker.currentWidget;
    if (panel === this._panel) {
      return;
    }
    if (this._panel) {
      this._panel.sessionContext.kernelChanged.disconnect(this._onKernel, this);
    }
    this._panel = panel;
    if (panel) {
      panel.sessionContext.kernelChanged.connect(this._onKernel, this);
    }
    this._onKernel();
  }

  private _onKernel(): void {
    const kernel = this._panel?.sessionContext.session?.kernel ?? null;
    this._setLink(kernel ? this._linkFor(kernel) : null);
  }

  private _linkFor(kernel: Kernel.IKernelConnection): KernelLink {
    let link = this._links.get(kernel);
    if (!link || link.isDisposed) {
      link = new KernelLink(kernel);
      this._links.set(kernel, link);
      kernel.disposed.connect(() => this._links.delete(kernel));
    }
    return link;
  }

  private _setLink(link: KernelLink | null): void {
    if (link === this._link) {
      return;
    }
    if (this._link) {
      this._link.changed.disconnect(this._onLinkChanged, this);
      this._link.replied.disconnect(this._onReply, this);
      this._link.told.disconnect(this._onTold, this);
    }
    this._link = link;
    if (link) {
      link.changed.connect(this._onLinkChanged, this);
      link.replied.connect(this._onReply, this);
      link.told.connect(this._onTold, this);
    }
    this._onLinkChanged();
  }

  private _onLinkChanged(): void {
    const active = this.active;
    if (active !== this._wasActive) {
      this._wasActive = active;
      this._activeChanged.emit();
    }
    this._changed.emit();
  }

  private _onReply(_: KernelLink, reply: IReply): void {
    this._replied.emit(reply);
  }

  private _onTold(_: KernelLink, event: IEvent): void {
    this._told.emit(event);
  }

  private _panel: NotebookPanel | null = null;
  private _link: KernelLink | null = null;
  private _wasActive = false;
  private _links = new Map<Kernel.IKernelConnection, KernelLink>();
  private _changed = new Signal<this, void>(this);
  private _activeChanged = new Signal<this, void>(this);
  private _replied = new Signal<this, IReply>(this);
  private _told = new Signal<this, IEvent>(this);
}

/** A short human form of a duration in seconds. */
export function formatSeconds(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '-';
  }
  return seconds < 10 ? `${seconds.toFixed(1)} s` : `${Math.round(seconds)} s`;
}

/**
 * Which launch of its process a row is: the world's incarnation, and the restarts of this
 * process alone (which rejoin the same incarnation, so the incarnation alone cannot tell).
 */
export function launchText(p: IProcess): string {
  const restarts = p.restarts ?? 0;
  return (
    `process ${p.rank} · incarnation ${p.incarnation ?? '-'}` +
    (restarts ? ` · restarted alone ${restarts}× since the cluster started` : '')
  );
}

/** A cache hit rate as a percentage, or a dash before any request. */
export function formatRate(rate: number | null | undefined): string {
  return rate === null || rate === undefined ? '-' : `${Math.round(rate * 100)}%`;
}

/** The cluster's health as the kernel states it (or as an older kernel implies it). */
export function healthOf(state: IState): IHealth {
  if (state.health) {
    return state.health;
  }
  const c = state.cluster;
  if (!c) {
    return { state: 'stopped', reason: 'no cluster is running', warning: false };
  }
  if (c.state !== 'ready') {
    return { state: c.state, reason: `the cluster is ${c.state}`, warning: false };
  }
  return c.warning
    ? { state: 'degraded', reason: '', warning: true }
    : { state: 'ready', reason: '', warning: false };
}

/** The one-line summary of a state shown in the status item. */
export function summary(state: IState | null): {
  text: string;
  kind: 'disconnected' | 'none' | 'starting' | 'ok' | 'warning';
  title: string;
} {
  if (!state) {
    return { text: 'jaxsys …', kind: 'disconnected', title: 'connecting to the kernel' };
  }
  const c = state.cluster;
  const health = healthOf(state);
  if (!c) {
    return { text: 'jaxsys: no cluster', kind: 'none', title: 'no cluster is running' };
  }
  if (health.state === 'starting' || health.state === 'restarting') {
    const title = health.reason || `the cluster is ${health.state}`;
    return { text: `jaxsys: ${health.state}…`, kind: 'starting', title };
  }
  // Every number says what it counts: a reader of the status bar has no legend.
  const cache = c.cache?.requests ? ` · cache ${formatRate(c.cache.hit_rate)} hits` : '';
  const text =
    `${health.warning ? '⚠ ' : ''}jaxsys: ${health.state} · ` +
    `${c.alive}/${c.nprocs} processes alive · ${c.live_devices} devices${cache}`;
  // Above the group size the title counts every state (the sidebar has the groups).
  const counts = c.summary ? ` (${stateCounts(c.summary.by_state)})` : '';
  const title =
    (health.reason ? `${health.state}: ${health.reason}; ` : '') +
    `${c.alive} of ${c.nprocs} processes alive${counts}; click for the jaxsys sidebar`;
  return { text, kind: health.warning ? 'warning' : 'ok', title };
}
