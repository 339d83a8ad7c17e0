import { Widget } from '@lumino/widgets';

import { JaxsysModel, summary } from './model';

/**
 * The status item: processes alive/total, live devices and the cache hit rate, a warning
 * state when a process is dead or stuck, and "no cluster" when none runs.
 *
 * `data-state` on the node says which: `disconnected`, `none`, `starting`, `ok` or
 * `warning`. A click runs `onClick` (opens the sidebar).
 */
export class JaxsysStatus extends Widget {
  constructor(
    private _model: JaxsysModel,
    onClick: () => void
  ) {
    super();
    this.addClass('jaxsys-status');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        onClick();
      }
    });
    _model.changed.connect(this._render, this);
    this._render();
  }

  private _render(): void {
    const { text, kind, title } = summary(this._model.state);
    this.node.textContent = text;
    this.node.title = title;
    this.node.dataset.state = kind;
    this.toggleClass('jaxsys-mod-warning', kind === 'warning');
    this.setHidden(!this._model.active);
  }
}
