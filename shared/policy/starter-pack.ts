// Hosts that package managers and source fetches need, offered as allow entries so that a block
// default does not break installs. Exact hosts only, on purpose: a wildcard such as
// *.githubusercontent.com or *.amazonaws.com would also allow every tenant's content on those
// shared domains (a ready exfiltration route), and a wildcard allow entry cannot be written into
// a hosts file anyway. Mirrors not listed here can be added by hand.
//
// The source hosts come read-only (GET and HEAD, case N3): fetching code and packages needs no
// more, and these are the hosts where a write with the run's own (or an attacker's) token is
// the easiest way out: a gist or an issue on api.github.com, a package published to npm. Not
// github.com: git over https fetches with POST (git-upload-pack). Not the OS, crates, Go, Maven,
// RubyGems and conda hosts: every limited host is terminated by the proxy (a TLS handshake per
// connection, and a name the run CA must cover), so the pack limits the hosts benchmarks fetch
// sources from most; crates.io and rubygems.org also take publishes and can be limited by hand.
export const STARTER_PACK_HOSTS: readonly string[] = Object.freeze([
  // npm and yarn
  "registry.npmjs.org",
  "registry.yarnpkg.com",
  // PyPI and pip's usual companions
  "pypi.org",
  "files.pythonhosted.org",
  "download.pytorch.org",
  // GitHub: git over https, the API, tarballs, raw files, release assets
  "github.com",
  "api.github.com",
  "codeload.github.com",
  "objects.githubusercontent.com",
  "raw.githubusercontent.com",
  "release-assets.githubusercontent.com",
  // Debian and Ubuntu package archives
  "deb.debian.org",
  "security.debian.org",
  "archive.ubuntu.com",
  "security.ubuntu.com",
  "ports.ubuntu.com",
  // Alpine packages
  "dl-cdn.alpinelinux.org",
  // Rust: crates and rustup
  "crates.io",
  "index.crates.io",
  "static.crates.io",
  "static.rust-lang.org",
  // Go modules
  "proxy.golang.org",
  "sum.golang.org",
  // Maven Central
  "repo.maven.apache.org",
  "repo1.maven.org",
  // RubyGems
  "rubygems.org",
  "index.rubygems.org",
  // conda (Anaconda defaults and conda-forge)
  "repo.anaconda.com",
  "conda.anaconda.org",
]);

/** Read-only: the methods a starter-pack source host allows. */
export const READ_ONLY_METHODS: readonly string[] = Object.freeze(["GET", "HEAD"]);

/** The starter pack's source hosts, allowed read-only (see the header). */
export const STARTER_PACK_READ_ONLY: ReadonlySet<string> = new Set([
  "api.github.com",
  "codeload.github.com",
  "objects.githubusercontent.com",
  "raw.githubusercontent.com",
  "release-assets.githubusercontent.com",
  "pypi.org",
  "files.pythonhosted.org",
  "registry.npmjs.org",
  "registry.yarnpkg.com",
]);

/** The method limit of a starter-pack host's entry, or null for none. */
export const starterPackMethods = (pattern: string): string[] | null =>
  STARTER_PACK_READ_ONLY.has(pattern) ? [...READ_ONLY_METHODS] : null;
