// TensorBoard loads this ES module in the TSCOPE tab's frame (its <base> is data/plugin/tscope/).
// It shows the dashboard page, served by the plugin at ./page, in a frame filling the tab; the page
// fetches the plugin's routes (runs, step, ops, series) by relative URLs.
export async function render() {
  document.documentElement.style.height = '100%';
  document.body.style.cssText = 'margin:0;height:100%;overflow:hidden';
  const frame = document.createElement('iframe');
  frame.id = 'tscope-page';
  frame.title = 'tscope dashboard';
  frame.src = './page';
  frame.style.cssText = 'border:0;width:100%;height:100%;display:block';
  document.body.appendChild(frame);
}
