// Hosts that package managers and source fetches need, offered as allow entries so that a block
// default does not break installs. Exact hosts only, on purpose: a wildcard such as
// *.githubusercontent.com or *.amazonaws.com would also allow every tenant's content on those
// shared domains (a ready exfiltration route), and a wildcard allow entry cannot be written into
// a hosts file anyway. Mirrors not listed here can be added by hand.
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
