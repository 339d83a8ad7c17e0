import { groupCounts, stateCounts } from './delta';
import { ICluster } from './protocol';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  return node;
}

/**
 * The groups of a cluster above the group size: a summary line, one row per group of
 * ranks (`p0-31: 32 alive`), the errors processes share, and, while a group is open, a
 * way back. A click on a group calls `onOpen(group)`; the kernel then sends its rows,
 * which the process table below shows. Hidden up to the group size.
 */
export class GroupTable {
  constructor(private _onOpen: (group: number | null) => void) {
    this._back.type = 'button';
    this._back.addEventListener('click', () => this._onOpen(null));
    this.node.append(this._line, this._back, this._list, this._errors);
  }

  readonly node = el('div', 'jaxsys-groups');

  /** Draw the summary of `c` (hidden when it has none). */
  render(c: ICluster | null): void {
    const summary = c?.summary ?? null;
    this.node.hidden = !summary;
    if (!summary || !c) {
      return;
    }
    const open = c.group ?? null;
    this.node.dataset.open = open === null ? '' : String(open);
    this._line.textContent =
      `${c.nprocs} processes in ${summary.groups.length} groups of ` +
      `${summary.group_size}: ${stateCounts(summary.by_state)}`;
    const shown = summary.groups.find(g => g.group === open);
    this._back.hidden = !shown;
    // Lab's .jp-Button sets display: inline-flex, which beats the hidden attribute: without
    // this the button stays on the page as an empty box while no group is open.
    this._back.style.display = shown ? '' : 'none';
    this._back.textContent = shown ? `← all groups (showing p${shown.ranks})` : '';
    // One button per group, reused across pushes so a click is never lost to a redraw.
    while (this._buttons.length > summary.groups.length) {
      this._buttons.pop()!.remove();
    }
    summary.groups.forEach((g, i) => {
      let b = this._buttons[i];
      if (!b) {
        b = el('button', 'jaxsys-group');
        b.type = 'button';
        b.addEventListener('click', () => this._onOpen(Number(b.dataset.group)));
        this._buttons.push(b);
        this._list.append(b);
      }
      b.dataset.group = String(g.group);
      b.dataset.worst = g.worst;
      b.className = `jaxsys-group jaxsys-state-${g.worst}`;
      b.classList.toggle('jaxsys-mod-open', g.group === open);
      b.textContent = `p${g.ranks}: ${groupCounts(g)}`;
      const late = g.oldest_heartbeat ? ` · oldest heartbeat ${g.oldest_heartbeat} s` : '';
      b.title = `processes ${g.ranks} on ${g.hosts || '-'}${g.busy ? ` · ${g.busy} busy` : ''}${late}; click for their rows`;
    });
    this._errors.replaceChildren(
      ...summary.errors.map(e =>
        el('li', 'jaxsys-group-error', e.ranks ? `p${e.ranks}: ${e.error}` : e.error)
      )
    );
  }

  private _line = el('div', 'jaxsys-groups-line');
  private _back = el('button', 'jp-Button jp-mod-styled jaxsys-button jaxsys-groups-back');
  private _list = el('div', 'jaxsys-group-list');
  private _errors = el('ul', 'jaxsys-group-errors');
  private _buttons: HTMLButtonElement[] = [];
}
