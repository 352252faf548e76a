// TensorBoard's nanscope tab: TensorBoard loads this module into the tab's iframe (whose
// document is TensorBoard's plugin entry page) and calls render(). The iframe then navigates to
// nanscope's own page, served under this plugin's route (/data/plugin/nanscope/index.html), so
// that the page runs under nanscope's Content-Security-Policy and its relative API URLs
// (api/runs, ...) resolve to the plugin's routes. The iframe is TensorBoard's own origin.
export function render() {
  location.replace(new URL("index.html", import.meta.url).href);
}
