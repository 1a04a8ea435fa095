// Vite's `?raw` imports: a file's text, bundled into the workerd test (which has no filesystem),
// e.g. a migration whose statements a test replays.
declare module "*?raw" {
  const text: string;
  export default text;
}
