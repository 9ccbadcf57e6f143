// jax_nbmem's JupyterLab face: one status poll per tab (model.ts), read by the status-bar item
// (status.ts), the GPU sidebar (sidebar.ts) and the notifications (notify.ts).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
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
  activate: () => new GpuStatus()
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

const statusItem: JupyterFrontEndPlugin<void> = {
  id: 'jax_nbmem:status-item',
  description: "The current notebook's kernel on the GPU, in the status bar.",
  autoStart: true,
  requires: [IGpuStatus, INotebookTracker],
  optional: [IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    model: IGpuStatus,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null
  ) => {
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
