#!/usr/bin/env node
// The `mailslot` command of the npm package: runs the native binary that npm installed from
// this platform's package (an optional dependency; nothing is downloaded at install time), with
// the same arguments, the same stdin/stdout/stderr and the same exit status. It writes nothing
// to stdout, which belongs to the MCP protocol under `mailslot mcp`.
'use strict';

const { spawn } = require('node:child_process');

// One package per platform, as `os` and `cpu` in its package.json select it.
const PLATFORMS = {
  'linux x64': '@mailslot/linux-x64',
  'linux arm64': '@mailslot/linux-arm64',
  'darwin x64': '@mailslot/darwin-x64',
  'darwin arm64': '@mailslot/darwin-arm64',
};

function fail(message) {
  process.stderr.write(`mailslot: ${message}\n`);
  process.exit(1);
}

function binary() {
  const platform = `${process.platform} ${process.arch}`;
  const pkg = PLATFORMS[platform];
  if (process.platform === 'win32') {
    fail(
      'Windows is not supported yet: the doorbells and the local relay rely on Unix sockets, ' +
        'signals and file modes; run mailslot under WSL, where the linux package installs',
    );
  }
  if (!pkg) {
    fail(
      `there is no prebuilt binary for ${platform}; build it from source with ` +
        '`cargo install --locked mailslot` (https://rustup.rs gives the toolchain)',
    );
  }
  try {
    return require.resolve(`${pkg}/bin/mailslot`);
  } catch {
    fail(
      `the package ${pkg}, which holds the binary for ${platform}, is not installed: ` +
        'npm skips optional dependencies under --omit=optional or --no-optional, and some ' +
        'lockfiles made on another platform leave it out; reinstall mailslot without them',
    );
  }
}

const child = spawn(binary(), process.argv.slice(2), { stdio: 'inherit' });

// A client that stops its MCP server signals this process: pass it on, so the binary ends too.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(signal, () => child.kill(signal));
}

child.on('error', (error) => fail(`cannot run ${child.spawnfile}: ${error.message}`));
child.on('exit', (code, signal) => {
  if (signal) {
    // End the same way, so the caller sees the signal; the handlers above would catch it.
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
  } else {
    process.exit(code ?? 1);
  }
});
