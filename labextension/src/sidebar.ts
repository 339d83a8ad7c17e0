import { Dialog, showDialog } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { GroupTable } from './groups';
import { formatRate, formatSeconds, healthOf, JaxsysModel, launchText } from './model';
import { Action, ICluster, IEvent, IProcess, IReply } from './protocol';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161"><rect x="2" y="3" width="8" height="8" rx="1"/>' +
  '<rect x="14" y="3" width="8" height="8" rx="1"/><rect x="2" y="13" width="8" height="8" rx="1"/>' +
  '<rect x="14" y="13" width="8" height="8" rx="1"/></g></svg>';

/** The jaxsys icon (four processes). */
export const jaxsysIcon = new LabIcon({ name: 'jaxsys:icon', svgstr: ICON_SVG });

/** Newest log lines the sidebar keeps. */
const MAX_LOG = 200;

/** The world as last drawn: whether a cluster runs, its state and incarnation, the dead. */
interface IWorld {
  cluster: boolean;
  state: string;
  incarnation: number | null;
  dead: Set<number>;
}

/** What the sidebar said for one kernel: its last answer, its log, the world it saw. */
interface ITranscript {
  message: string;
  error: boolean;
  lines: string[];
  world?: IWorld;
}

/** What changed in the world between two states, in the log's words. */
function worldChanges(before: IWorld, now: IWorld, nprocs: number): string[] {
  const lines: string[] = [];
  if (!before.cluster && now.cluster) {
    lines.push(`cluster ${now.state === 'ready' ? 'ready' : 'starting'}: ${nprocs} processes`);
  } else if (before.cluster && !now.cluster) {
    lines.push('cluster stopped');
  } else if (now.cluster && now.state !== before.state) {
    if (now.state === 'restarting') {
      lines.push('JAX world restarting: every process starts empty');
    } else if (now.state === 'ready') {
      lines.push(`cluster ready: ${nprocs} processes`);
    }
  } else if (
    now.incarnation !== null &&
    before.incarnation !== null &&
    now.incarnation !== before.incarnation
  ) {
    lines.push(`new JAX world: ${nprocs} processes, every one started empty`);
  }
  if (now.cluster && now.incarnation === before.incarnation) {
    for (const r of now.dead) {
      if (!before.dead.has(r)) {
        lines.push(`p${r} died`);
      }
    }
  }
  return lines;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

/** The process table's columns: the header shown, and its title. */
const COLUMNS: [string, string][] = [
  ['proc', 'process (↻N: restarted alone N times in this world)'],
  ['host', 'host'],
  ['dev', 'devices'],
  ['state', 'state'],
  ['beat', 'seconds since the last heartbeat'],
  ['', 'kill (✕) or restart (↻) the process']
];

function fill(cell: HTMLElement, text: string, title: string): void {
  cell.textContent = text;
  cell.title = title;
}

function button(label: string, className: string, title: string): HTMLButtonElement {
  const node = el('button', `jp-Button jp-mod-styled jaxsys-button ${className}`, label);
  node.title = title;
  node.type = 'button';
  return node;
}

/**
 * The sidebar: the process table, the live-devices grid, a cache summary, the security
 * line, and buttons for start, stop, restart the world, dump stacks and, per process,
 * kill and restart.
 *
 * The buttons are built once and rows are updated in place, so a click is never lost to
 * a state push redrawing the panel.
 */
export class JaxsysSidebar extends Widget {
  constructor(private _model: JaxsysModel) {
    super();
    this.id = 'jaxsys-sidebar';
    this.addClass('jaxsys-sidebar');
    this.title.icon = jaxsysIcon;
    this.title.caption = 'jaxsys cluster';
    this._build();
    _model.changed.connect(this._render, this);
    _model.replied.connect(this._onReply, this);
    _model.told.connect(this._onTold, this);
    this._render();
  }

  /** Run an action, showing its progress and answer in the panel. */
  async run(action: Action, rank: number | null = null): Promise<IReply | null> {
    const what = rank === null ? action : `${action} p${rank}`;
    this._busy.add(what);
    this._say(`${what}…`, false);
    this._render();
    try {
      return await this._model.command(action, rank);
    } catch (reason) {
      this._say(`${what} failed: ${reason}`, true);
      return null;
    } finally {
      this._busy.delete(what);
      this._render();
    }
  }

  /**
   * Add a button beside the actions that runs `onClick` (an application command), enabled
   * while the world can restart.
   */
  addButton(label: string, className: string, title: string, onClick: () => void): void {
    const node = button(label, className, title);
    node.addEventListener('click', onClick);
    this._extra.push(node);
    this._actions.append(node);
    this._render();
  }

  /** Say something in the panel and its log, stamped with the time. */
  note(message: string, error = false): void {
    this._say(message, error);
    const stamp = new Date().toLocaleTimeString([], { hour12: false });
    const t = this._transcript;
    t.lines = [...t.lines, `${stamp} ${message}`].slice(-MAX_LOG);
    this._showLog();
  }

  private _build(): void {
    const head = el('div', 'jaxsys-head');
    head.append(el('h2', 'jaxsys-title', 'jaxsys'), this._kernel);
    const actions = this._actions;
    const buttons: [Action, string, string, string][] = [
      ['start', 'Start', 'jaxsys-start', 'start a cluster with the kernel’s defaults'],
      ['stop-cluster', 'Stop', 'jaxsys-stop', 'stop the cluster (a running cell is interrupted first)'],
      // `restart` without a process: the whole world (with one, the row's button).
      ['restart', 'Restart world', 'jaxsys-restart-world', 'replace every process'],
      ['stacks', 'Dump stacks', 'jaxsys-stacks', 'where each process is: its stack, or idle']
    ];
    for (const [action, label, cls, title] of buttons) {
      const node = button(label, cls, title);
      node.addEventListener('click', () => void this.run(action));
      this._buttons.set(action, node);
      actions.append(node);
    }
    const table = el('table', 'jaxsys-processes');
    const header = el('tr');
    // Short headers, whole at the default width; the title says each in full.
    for (const [h, title] of COLUMNS) {
      const th = el('th', '', h);
      th.title = title;
      header.append(th);
    }
    table.append(el('thead'), this._rows);
    table.tHead!.append(header);
    // Fixed columns (style/index.css): the row's buttons stay inside the panel at any width.
    const scroller = el('div', 'jaxsys-table-scroll');
    scroller.append(this._groups.node, table);
    this.node.append(
      head,
      this._summary,
      actions,
      this._message,
      this._section('Processes', scroller),
      this._section('Live devices', this._grid),
      this._section('Compilation cache', this._cache),
      this._section('Security', this._security),
      this._section('Log', this._log)
    );
  }

  private _section(title: string, body: HTMLElement): HTMLElement {
    const section = el('section', 'jaxsys-section');
    section.append(el('h3', '', title), body);
    return section;
  }

  private _render(): void {
    const state = this._model.state;
    const c = state?.cluster ?? null;
    this._follow(this._model.link);
    this._kernel.textContent = !this._model.link
      ? 'no notebook'
      : this._model.link.isJaxsys === false
        ? 'not a jaxsys kernel'
        : state
          ? `kernel pid ${state.kernel.pid} · jaxsys ${state.kernel.version}`
          : 'connecting…';
    if (state) {
      this.node.dataset.kernelPid = String(state.kernel.pid);
    } else {
      delete this.node.dataset.kernelPid;
    }
    const health = state ? healthOf(state) : null;
    this._summary.textContent = !state
      ? ''
      : !c
        ? 'no cluster'
        : `${health!.state}${health!.reason ? `: ${health!.reason}` : ''} · ` +
          `${c.alive}/${c.nprocs} processes alive · ${c.live_devices}/${c.devices} devices` +
          `${state.cell_running ? ' · a cell is running' : ''}`;
    this._summary.dataset.health = health?.state ?? '';
    this._summary.classList.toggle('jaxsys-mod-warning', !!health?.warning);
    const connected = this._model.link?.connected ?? false;
    const ready = connected && c?.state === 'ready';
    const enabled: Record<string, boolean> = {
      start: connected && !c,
      'stop-cluster': connected && !!c,
      restart: ready,
      stacks: ready
    };
    for (const [action, node] of this._buttons) {
      node.disabled = !enabled[action] || this._busy.has(action);
    }
    for (const node of this._extra) {
      node.disabled = !ready || this._busy.size > 0;
    }
    this._followWorld(c);
    this._groups.render(c);
    this._renderRows(c, ready);
    this._renderGrid(c);
    this._renderCache(c);
    this._security.textContent = c ? c.security : '-';
  }

  private _renderRows(c: ICluster | null, ready: boolean): void {
    const procs = c?.processes ?? [];
    // No cluster, or above the group size with no group open: no empty table.
    this._rows.parentElement!.hidden = !c || (!!c.summary && procs.length === 0);
    const seen = new Set<number>();
    for (const p of procs) {
      seen.add(p.rank);
      let row = this._rowByRank.get(p.rank);
      if (!row) {
        row = this._makeRow(p.rank);
        this._rowByRank.set(p.rank, row);
      }
      this._fillRow(row, p, ready);
    }
    for (const [rank, row] of this._rowByRank) {
      if (!seen.has(rank)) {
        row.remove();
        this._rowByRank.delete(rank);
      }
    }
    // Keep rank order whatever the arrival order of rows.
    for (const p of procs) {
      this._rows.append(this._rowByRank.get(p.rank)!);
    }
  }

  private _makeRow(rank: number): HTMLTableRowElement {
    const row = el('tr', 'jaxsys-process');
    row.dataset.rank = String(rank);
    for (let i = 0; i < 5; i++) {
      row.append(el('td'));
    }
    const cell = el('td', 'jaxsys-row-actions');
    // Symbols keep the table narrow enough for the default sidebar width.
    const kill = button('✕', 'jaxsys-kill', `kill process ${rank} (SIGKILL)`);
    kill.setAttribute('aria-label', `kill p${rank}`);
    kill.addEventListener('click', () => void this._confirmKill(rank));
    const restart = button('↻', 'jaxsys-restart', `restart process ${rank}`);
    restart.setAttribute('aria-label', `restart p${rank}`);
    restart.addEventListener('click', () => void this.run('restart', rank));
    cell.append(kill, restart);
    row.append(cell);
    return row;
  }

  private _fillRow(row: HTMLTableRowElement, p: IProcess, ready: boolean): void {
    const cells = row.cells;
    // A process restarted alone keeps its world's incarnation: the row counts its restarts.
    cells[0].textContent = `p${p.rank}${p.restarts ? ` ↻${p.restarts}` : ''}`;
    cells[0].title = launchText(p);
    // A cell too narrow for its text ends in an ellipsis; its title holds the whole text.
    fill(cells[1], p.host || '-', `host ${p.host || '-'}`);
    fill(cells[2], p.devices.join(',') || '-', `devices ${p.devices.join(', ') || '-'}`);
    const busy = p.busy && p.state === 'alive';
    fill(cells[3], busy ? 'busy' : p.state, busy ? 'alive, running a cell' : p.state);
    cells[3].className = `jaxsys-state jaxsys-state-${p.state}`;
    fill(cells[4], formatSeconds(p.heartbeat_age), 'seconds since its last heartbeat');
    row.dataset.state = p.state;
    const [kill, restart] = Array.from(cells[5].querySelectorAll('button'));
    kill.disabled = !ready || p.state === 'dead' || this._busy.has(`kill p${p.rank}`);
    restart.disabled = !ready || this._busy.has(`restart p${p.rank}`);
  }

  private _renderGrid(c: ICluster | null): void {
    this._grid.replaceChildren();
    if (!c) {
      this._grid.textContent = '-';
      return;
    }
    if (c.summary && c.processes.length === 0) {
      // Above the group size only the open group's rows (and devices) are sent.
      this._grid.textContent = 'Open a group above to see its devices.';
      return;
    }
    for (const p of c.processes) {
      for (const d of p.devices) {
        const cell = el('span', `jaxsys-device jaxsys-state-${p.state}`, String(d));
        cell.title = `device ${d} · process ${p.rank} · ${p.state}`;
        this._grid.append(cell);
      }
    }
  }

  private _renderCache(c: ICluster | null): void {
    const cache = c?.cache;
    if (!cache) {
      this._cache.textContent = c ? 'no telemetry' : '-';
      return;
    }
    this._cache.textContent =
      `hit rate ${formatRate(cache.hit_rate)} (${cache.hits} of ${cache.requests} requests)` +
      ` · ${cache.compiles} compiles (${formatSeconds(cache.compile_time)})` +
      ` · saved ${formatSeconds(cache.time_saved)} · ${cache.entries} entries on disk`;
  }

  /** Kill only once the user confirms: it cannot be undone. */
  private async _confirmKill(rank: number): Promise<void> {
    const answer = await showDialog({
      title: `Kill process ${rank}?`,
      body: `Process ${rank} gets SIGKILL at once; cells running on it fail.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Kill' })]
    });
    if (answer.button.accept) {
      await this.run('kill', rank);
    }
  }

  /**
   * Log what changed in the world, whoever changed it (a cell's auto-start, `%jaxsys stop`,
   * a death), so the last-action line never describes a world that is gone.
   */
  private _followWorld(c: ICluster | null): void {
    if (!this._model.state) {
      return;
    }
    const t = this._transcript;
    const incarnations = (c?.processes ?? []).map(p => p.incarnation ?? 0);
    const now: IWorld = {
      cluster: !!c,
      state: c?.state ?? 'stopped',
      incarnation: incarnations.length ? Math.max(...incarnations) : null,
      dead: new Set((c?.processes ?? []).filter(p => p.state === 'dead').map(p => p.rank))
    };
    const before = t.world;
    t.world = now;
    if (!before) {
      return;
    }
    // The sidebar's own Stop ends every process: those are not deaths to report.
    const stopping = this._busy.has('stop-cluster');
    for (const line of worldChanges(before, now, c?.nprocs ?? 0)) {
      if (stopping && line.endsWith(' died')) {
        continue;
      }
      // A reply or event that already said it (the sidebar's Stop) is not said twice.
      if (!t.message.includes(line)) {
        this.note(line);
      }
    }
  }

  /** Another surface carried out a command: the log shows it beside the sidebar's own. */
  private _onTold(_: JaxsysModel, event: IEvent): void {
    const who = event.surface === 'jaxsys' ? '%jaxsys' : event.surface;
    const what = `${who} ${event.action}${event.rank === null ? '' : ` p${event.rank}`}`;
    const t = this._transcript;
    t.lines = [...t.lines, ...event.log].slice(-MAX_LOG);
    this.note(`${what}: ${event.message}`, !event.ok);
  }

  private _onReply(_: JaxsysModel, reply: IReply): void {
    this._say(reply.message, !reply.ok);
    // The kernel's log lines carry their own time; a bare answer gets one here.
    const stamp = new Date().toLocaleTimeString([], { hour12: false });
    const told = reply.log.some(line => line.endsWith(reply.message));
    const lines = told ? reply.log : [...reply.log, `${stamp} ${reply.action}: ${reply.message}`];
    const t = this._transcript;
    t.lines = [...t.lines, ...lines].slice(-MAX_LOG);
    this._showLog();
  }

  private _say(message: string, error: boolean): void {
    this._transcript.message = message;
    this._transcript.error = error;
    this._message.textContent = message;
    this._message.classList.toggle('jaxsys-mod-error', error);
  }

  /** Show the transcript of the current kernel: another kernel's answers are not its. */
  private _follow(link: object | null): void {
    if (link === this._shownLink) {
      return;
    }
    this._shownLink = link;
    let t = link ? this._transcripts.get(link) : undefined;
    if (!t) {
      t = { message: '', error: false, lines: [] };
      if (link) {
        this._transcripts.set(link, t);
      }
    }
    this._transcript = t;
    this._message.textContent = t.message;
    this._message.classList.toggle('jaxsys-mod-error', t.error);
    this._showLog();
  }

  /** Show the log, scrolled to its newest line. */
  private _showLog(): void {
    this._log.textContent = this._transcript.lines.join('\n');
    this._log.scrollTop = this._log.scrollHeight;
  }

  private _groups = new GroupTable(group => this._model.openGroup(group));
  private _kernel = el('div', 'jaxsys-kernel');
  private _summary = el('div', 'jaxsys-summary');
  private _message = el('div', 'jaxsys-message');
  private _rows = el('tbody');
  private _grid = el('div', 'jaxsys-devices');
  private _cache = el('div', 'jaxsys-cache');
  private _security = el('div', 'jaxsys-security');
  private _log = el('pre', 'jaxsys-log');
  private _shownLink: object | null | undefined = undefined;
  private _transcript: ITranscript = { message: '', error: false, lines: [] };
  private _transcripts = new WeakMap<object, ITranscript>();
  private _buttons = new Map<Action, HTMLButtonElement>();
  private _actions = el('div', 'jaxsys-actions');
  private _extra: HTMLButtonElement[] = [];
  private _rowByRank = new Map<number, HTMLTableRowElement>();
  private _busy = new Set<string>();
}
