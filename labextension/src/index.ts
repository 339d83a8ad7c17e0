import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { IEditorLanguageRegistry } from '@jupyterlab/codemirror';
import { IMainMenu } from '@jupyterlab/mainmenu';
import {
  INotebookTracker,
  Notebook,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { registerJaxsysLanguage } from './highlight';
import { JaxsysModel } from './model';
import { Action } from './protocol';
import { JaxsysSidebar } from './sidebar';
import { JaxsysStatus } from './status';

/** The command ids. */
export namespace CommandIDs {
  export const startCluster = 'jaxsys:start-cluster';
  export const stopCluster = 'jaxsys:stop-cluster';
  export const restartWorld = 'jaxsys:restart-world';
  export const dumpStacks = 'jaxsys:dump-stacks';
  export const openSidebar = 'jaxsys:open-sidebar';
  export const restartRunToSelected = 'jaxsys:restart-world-run-to-selected';
  export const restartRunAll = 'jaxsys:restart-world-run-all';
}

/** The DOM id of the status item. */
export const STATUS_ID = 'jaxsys-status';

function addCommands(
  app: JupyterFrontEnd,
  model: JaxsysModel,
  sidebar: JaxsysSidebar
): void {
  const open = (): void => {
    if (!sidebar.isAttached) {
      app.shell.add(sidebar, 'left', { rank: 900 });
    }
    app.shell.activateById(sidebar.id);
  };
  app.commands.addCommand(CommandIDs.openSidebar, {
    label: 'jaxsys: Open the Cluster Sidebar',
    caption: 'Processes, devices, cache and controls of the notebook’s cluster',
    execute: open
  });
  const cluster = () => model.state?.cluster ?? null;
  const ready = () => model.link?.connected === true && cluster()?.state === 'ready';
  const actions: [string, Action, string, () => boolean][] = [
    [
      CommandIDs.startCluster,
      'start',
      'jaxsys: Start the Cluster',
      () => model.link?.connected === true && !cluster()
    ],
    [
      CommandIDs.stopCluster,
      'stop-cluster',
      'jaxsys: Stop the Cluster',
      () => model.link?.connected === true && !!cluster()
    ],
    // `restart` without a process restarts the whole world.
    [CommandIDs.restartWorld, 'restart', 'jaxsys: Restart the JAX World', ready],
    [CommandIDs.dumpStacks, 'stacks', 'jaxsys: Dump the Stacks of Every Process', ready]
  ];
  for (const [id, action, label, isEnabled] of actions) {
    app.commands.addCommand(id, {
      label,
      isEnabled,
      execute: async () => {
        // The answer (and for stacks, the frames) shows in the sidebar.
        open();
        return sidebar.run(action);
      }
    });
  }
  addRestartAndRun(app, model, sidebar, ready, open);
  model.changed.connect(() => app.commands.notifyCommandChanged());
}

/** Whether a code cell starts a cluster (`%jaxsys start` on a line of its own). */
function startsCluster(cell: Notebook['widgets'][number]): boolean {
  const source = cell.model.sharedModel.getSource();
  return cell.model.type === 'code' && /^\s*%jaxsys\s+start\b/m.test(source);
}

/**
 * Restart the JAX world, then run the notebook's cells again, as JupyterLab's own
 * "Restart Kernel and Run ..." do for the kernel: every process starts empty, and the cells
 * that built its state build it again. The kernel itself keeps running.
 */
function addRestartAndRun(
  app: JupyterFrontEnd,
  model: JaxsysModel,
  sidebar: JaxsysSidebar,
  ready: () => boolean,
  open: () => void
): void {
  const variants: [string, string, string, boolean][] = [
    [
      CommandIDs.restartRunToSelected,
      'Restart JAX World and Run up to Selected Cell…',
      'Restart, run to selected',
      true
    ],
    [CommandIDs.restartRunAll, 'Restart JAX World and Run All Cells…', 'Restart, run all', false]
  ];
  for (const [id, label, short, upTo] of variants) {
    const execute = async (): Promise<boolean> => {
      const panel = model.panel;
      if (!panel) {
        return false;
      }
      const answer = await showDialog({
        title: `Restart the JAX world and ${upTo ? 'run up to the selected cell' : 'run all cells'}?`,
        body:
          'Every process starts empty: what %%multihost cells defined is lost, and the ' +
          'cells run again to rebuild it. The kernel and its own names stay.',
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Restart' })]
      });
      if (!answer.button.accept) {
        return false;
      }
      // The restart's progress and answer show in the sidebar, as for the other commands.
      open();
      const reply = await sidebar.run('restart');
      if (!reply?.ok) {
        // The sidebar shows why; cells run against a world that did not come back would fail.
        return false;
      }
      const { content, sessionContext } = panel;
      const last = upTo ? content.activeCellIndex : content.widgets.length - 1;
      const cells = content.widgets.slice(0, last + 1);
      // The restarted world keeps the options it was started with: a cell that starts
      // the cluster would be refused (one is running), and stop the run there.
      const skipped = cells.filter(startsCluster);
      if (skipped.length) {
        const which = skipped.map(c => `cell ${content.widgets.indexOf(c) + 1}`).join(', ');
        sidebar.note(`${short}: skipped ${which} (%jaxsys start): the restarted world is running`);
      }
      return NotebookActions.runCells(
        content,
        cells.filter(c => !skipped.includes(c)),
        sessionContext
      );
    };
    app.commands.addCommand(id, { label, isEnabled: () => ready() && !!model.panel, execute });
    sidebar.addButton(short, `jaxsys-${id.split(':')[1]}`, label, () => {
      void app.commands.execute(id);
    });
  }
}

/** Where the status item goes when the shell has no status bar (Notebook 7). */
function addToToolbars(
  tracker: INotebookTracker,
  model: JaxsysModel,
  onClick: () => void
): void {
  const add = (panel: NotebookPanel) => {
    const item = new JaxsysStatus(model, onClick);
    // Ids are unique: only the first toolbar item gets it (Notebook 7 shows one notebook).
    if (!document.getElementById(STATUS_ID)) {
      item.id = STATUS_ID;
    }
    panel.toolbar.insertItem(10, 'jaxsys-status', item);
  };
  tracker.forEach(add);
  tracker.widgetAdded.connect((_, panel) => add(panel));
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jaxsys:plugin',
  description: 'The jaxsys cluster in the status bar and a sidebar, and its commands.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IMainMenu, IEditorLanguageRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    languages: IEditorLanguageRegistry | null
  ) => {
    if (languages) {
      registerJaxsysLanguage(languages);
    }
    const model = new JaxsysModel(tracker);
    const sidebar = new JaxsysSidebar(model);
    app.shell.add(sidebar, 'left', { rank: 900 });
    addCommands(app, model, sidebar);
    const openSidebar = () => void app.commands.execute(CommandIDs.openSidebar);
    if (statusBar) {
      const item = new JaxsysStatus(model, openSidebar);
      item.id = STATUS_ID;
      statusBar.registerStatusItem('jaxsys:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => model.active,
        activeStateChanged: model.activeChanged
      });
    } else {
      addToToolbars(tracker, model, openSidebar);
    }
    const ids = [
      CommandIDs.startCluster,
      CommandIDs.stopCluster,
      CommandIDs.restartWorld,
      CommandIDs.restartRunToSelected,
      CommandIDs.restartRunAll,
      CommandIDs.dumpStacks,
      CommandIDs.openSidebar
    ];
    if (palette) {
      for (const command of ids) {
        palette.addItem({ command, category: 'jaxsys' });
      }
    }
    if (mainMenu) {
      mainMenu.kernelMenu.addGroup(
        ids.map(command => ({ command })),
        100
      );
    }
  }
};

export default plugin;
