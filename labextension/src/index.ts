// jax_nbmem's JupyterLab face: one status poll per tab (model.ts), read by the status-bar item
// (status.ts), the GPU sidebar (sidebar.ts) and the notifications (notify.ts).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import type { INotebookTracker } from '@jupyterlab/notebook';
import type { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { GpuStatus, IGpuStatus } from './model';
import { BlockingNotifier } from './notify';
import { GpuSidebar, SIDEBAR_ID } from './sidebar';
import { GpuStatusItem } from './status';

import gpuSvg from '../style/gpu.svg';

const gpuIcon = new LabIcon({ name: 'jax_nbmem:gpu', svgstr: gpuSvg });

function opener(app: JupyterFrontEnd): (path: string) => void {
  return path => void app.commands.execute('docmanager:open', { path });
}

const statusModel: JupyterFrontEndPlugin<IGpuStatus> = {
  id: 'jax_nbmem:status-model',
  description: "One poll of the server extension's GPU status for the whole tab.",
  autoStart: true,
  provides: IGpuStatus,
  activate: (app: JupyterFrontEnd) => new GpuStatus(notebookShell(app).then(shell => !!shell))
};

const sidebar: JupyterFrontEndPlugin<void> = {
  id: 'jax_nbmem:sidebar',
  description: 'The GPU sidebar: GPUs, kernels on them, warnings, shut-down of your own.',
  autoStart: true,
  requires: [IGpuStatus],
  activate: (app: JupyterFrontEnd, model: IGpuStatus) => {
    // Added once the server has answered, and only if it has the jax_nbmem extension.
    void model.ready.then(() => {
      if (model.available) {
        const widget = new GpuSidebar(model, opener(app));
        widget.title.icon = gpuIcon;
        app.shell.add(widget, 'left', { rank: 900 });
      }
    });
  }
};

/**
 * The notebook tracker and the status bar of the page, or null where the page has no such
 * modules (Voilà, other pages built from some of JupyterLab's packages): imported when the
 * plugin starts, not with the extension, so that such a page loads the rest of it and logs
 * nothing of ours.
 */
function notebookShell(app: JupyterFrontEnd): Promise<INotebookShell | null> {
  let shell = shells.get(app);
  if (!shell) {
    shell = findNotebookShell(app);
    shells.set(app, shell);
  }
  return shell;
}

interface INotebookShell {
  tracker: INotebookTracker;
  statusBar: IStatusBar | null;
}

const shells = new WeakMap<JupyterFrontEnd, Promise<INotebookShell | null>>();

async function findNotebookShell(app: JupyterFrontEnd): Promise<INotebookShell | null> {
  try {
    const [notebook, statusbar] = await Promise.all([
      import('@jupyterlab/notebook'),
      import('@jupyterlab/statusbar')
    ]);
    const tracker = await app.resolveOptionalService(notebook.INotebookTracker);
    const statusBar = await app.resolveOptionalService(statusbar.IStatusBar);
    return tracker ? { tracker, statusBar } : null;
  } catch (error) {
    return null;
  }
}

const statusItem: JupyterFrontEndPlugin<void> = {
  id: 'jax_nbmem:status-item',
  description: "The current notebook's kernel on the GPU, in the status bar.",
  autoStart: true,
  requires: [IGpuStatus],
  activate: async (app: JupyterFrontEnd, model: IGpuStatus) => {
    const shell = await notebookShell(app);
    if (!shell) {
      return; // no notebooks to follow here
    }
    const { tracker, statusBar } = shell;
    const item = new GpuStatusItem(model, tracker, () => app.shell.activateById(SIDEBAR_ID));
    // Switching notebooks redraws from the last snapshot: no request of its own.
    if (!statusBar) {
      // Notebook 7 has no status bar: the item goes in its top bar, beside the notebook's name.
      item.addClass('jax-nbmem-item-top');
      app.shell.add(item, 'top', { rank: 1000 });
      const follow = () => item.setHidden(!item.shown);
      model.changed.connect(follow);
      tracker.currentChanged.connect(follow);
      follow();
      return;
    }
    statusBar.registerStatusItem('jax_nbmem:status-item', {
      item,
      align: 'left',
      rank: 4,
      isActive: () => item.shown,
      activeStateChanged: model.changed
    });
  }
};

const notifications: JupyterFrontEndPlugin<void> = {
  id: 'jax_nbmem:notifications',
  description: 'A notification when one of your kernels starts blocking others on a GPU.',
  autoStart: true,
  requires: [IGpuStatus],
  activate: (app: JupyterFrontEnd, model: IGpuStatus) => {
    new BlockingNotifier(model, opener(app));
  }
};

export default [statusModel, sidebar, statusItem, notifications];
