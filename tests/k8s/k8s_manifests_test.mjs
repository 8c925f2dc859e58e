// Static checks of deploy/k8s and deploy/image: every overlay renders (also
// with the RDMA component), every object validates, every flag and FLOTILLA_*
// variable a container uses is an option of the program it runs, instance
// sizes add up, every coordinator starts with its rendered values, and the
// image recipe holds what the manifests run.
// Usage: node k8s_manifests_test.mjs BUILD_DIR NODE_MODULES
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  containers, envValue, k8sDir, overlays, podTemplates, render, sourceDir, validate,
} from './manifests.mjs';

const [buildDir, modules] = process.argv.slice(2).map((p) => path.resolve(p));
const failures = [];
const fail = (msg) => { failures.push(msg); console.log(`FAIL ${msg}`); };
const pass = (msg) => console.log(`ok   ${msg}`);

// Program name -> {flags, env} from its --help (subcommands before --help).
const helpCache = new Map();
function options(program, subcommands) {
  const key = [program, ...subcommands].join(' ');
  if (helpCache.has(key)) return helpCache.get(key);
  const local = program === 'flotilla-pod-workers'
    ? path.join(sourceDir, 'deploy/image', program) : path.join(buildDir, 'bin', program);
  let help = '';
  try {
    help = execFileSync(local, [...subcommands, '--help'], {
      encoding: 'utf8', env: { ...process.env, FLOTILLA_WORKER_BINARY: path.join(buildDir, 'bin/flotilla-worker') },
    });
  } catch (e) {
    help = `${e.stdout ?? ''}`;
  }
  const found = {
    known: help.length > 0,
    flags: new Set(help.match(/--[a-z0-9][a-z0-9-]*/g) ?? []),
    env: new Set([...help.matchAll(/Env:(FLOTILLA_[A-Z0-9_]+)/g)].map((m) => m[1])),
  };
  helpCache.set(key, found);
  return found;
}

function checkContainer(where, c) {
  const program = path.basename(c.command?.[0] ?? '');
  if (!c.command?.[0]?.startsWith('/opt/flotilla/bin/')) {
    if (c.command) fail(`${where}: command ${c.command[0]} is not one of the image's programs`);
    return;
  }
  const subcommands = c.command.slice(1).filter((a) => !a.startsWith('-'));
  const opts = options(program, subcommands);
  if (!opts.known) { fail(`${where}: ${program} is not built (no --help)`); return; }
  for (const arg of [...c.command.slice(1), ...(c.args ?? [])]) {
    if (!arg.startsWith('--')) continue;
    const flag = arg.split('=')[0];
    if (!opts.flags.has(flag)) fail(`${where}: flag ${flag} is not an option of ${[program, ...subcommands].join(' ')}`);
  }
  for (const e of c.env ?? []) {
    if (e.name.startsWith('FLOTILLA_') && !opts.env.has(e.name)) {
      fail(`${where}: variable ${e.name} is read by no option of ${[program, ...subcommands].join(' ')}`);
    }
  }
}

// Workers the coordinator waits for = worker pods x workers per pod.
function checkSizes(name, objects) {
  const pods = podTemplates(objects);
  let expected = 0, workers = null;
  for (const p of pods) {
    for (const c of p.template.spec.containers) {
      if (c.command?.[0]?.endsWith('/flotilla-coordinator')) workers = Number(envValue(c, 'FLOTILLA_WORKERS'));
      if (c.command?.[0]?.endsWith('/flotilla-pod-workers')) {
        const pods = p.role === 'leader' ? p.object.spec.replicas ?? 1 : p.replicas;
        const perInstance = p.object.kind === 'LeaderWorkerSet' ? pods / (p.object.spec.replicas ?? 1) : pods;
        expected += perInstance * Number(envValue(c, 'FLOTILLA_WORKERS_PER_POD') ?? 1);
      }
    }
  }
  if (workers === expected) pass(`${name}: FLOTILLA_WORKERS ${workers} = worker pods x workers per pod`);
  else fail(`${name}: the coordinator waits for ${workers} workers but the pods run ${expected}`);
}

// Each coordinator starts with its rendered environment and arguments, but
// for listeners on free loopback ports, synthetic:120b as the model (its
// shapes, no checkpoint: placement is checked at start) and a
// scratch token file: a value its flags refuse (FLOTILLA_COMM=nccl once was)
// fails here. Up = it wrote its port file; it is stopped then.
async function checkCoordinatorStarts(where, c) {
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-coord-'));
  const env = { PATH: process.env.PATH };
  for (const e of c.env ?? []) if (e.value !== undefined) env[e.name] = e.value;
  Object.assign(env, { FLOTILLA_MODEL: 'synthetic:120b', FLOTILLA_CLUSTER_TOKEN_FILE: path.join(scratch, 'token') });
  fs.writeFileSync(env.FLOTILLA_CLUSTER_TOKEN_FILE, 'a'.repeat(64) + '\n', { mode: 0o600 });
  const args = (c.args ?? []).map((a) => (a.startsWith('--listen=') ? '--listen=127.0.0.1:0'
    : a.startsWith('--http-listen=') ? '--http-listen=127.0.0.1:0' : a));
  const portFile = path.join(scratch, 'port');
  const proc = spawn(path.join(buildDir, 'bin', path.basename(c.command[0])), [...args, '--port-file', portFile],
    { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  proc.stdout.on('data', (d) => { output += d; });
  proc.stderr.on('data', (d) => { output += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
  let code = null;
  for (let i = 0; i < 200 && code === null && !fs.existsSync(portFile); i++) {
    code = await Promise.race([exited, new Promise((r) => setTimeout(() => r(null), 100))]);
  }
  if (fs.existsSync(portFile)) pass(`${where}: the coordinator starts with its rendered values`);
  else fail(`${where}: the coordinator did not start with its rendered values (exit ${code}): ${output.trim()}`);
  proc.kill('SIGKILL');
  await exited;
  fs.rmSync(scratch, { recursive: true, force: true });
}

// The image recipe against the manifests and the build.
function checkImage(all) {
  const dockerfile = fs.readFileSync(path.join(sourceDir, 'deploy/image/Dockerfile'), 'utf8');
  const stage = fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-stage-'));
  try {
    execFileSync(path.join(sourceDir, 'deploy/image/stage.sh'), [stage, buildDir], { stdio: 'inherit' });
    const uids = new Set([...dockerfile.matchAll(/useradd --uid (\d+)/g)].map((m) => Number(m[1])));
    for (const target of ['cpu', 'cuda']) {
      const from = dockerfile.match(new RegExp(`^FROM (\\S+) AS ${target}$`, 'm'));
      if (!from) { fail(`Dockerfile: no target ${target}`); continue; }
      const want = target === 'cpu' ? /-slim$/ : /-runtime-/;
      if (!want.test(from[1])) fail(`Dockerfile: target ${target} is FROM ${from[1]}, expected ${want}`);
      if (!dockerfile.includes(`COPY --from=build-${target} /staging/ /`)) fail(`Dockerfile: ${target} does not copy the staged files`);
    }
    const stages = dockerfile.match(/deploy\/image\/stage\.sh \/staging \/src\/build --packages/g) ?? [];
    if (stages.length !== 2) fail(`Dockerfile: expected both build stages to run stage.sh, found ${stages.length}`);
    if ((dockerfile.match(/^USER 10001:10001$/gm) ?? []).length !== 2) fail('Dockerfile: both images must run as USER 10001:10001');
    for (const { name, objects } of all) {
      for (const p of podTemplates(objects)) {
        const user = p.template.spec.securityContext?.runAsUser;
        if (!uids.has(user)) fail(`${name}: runAsUser ${user} is not the image's user (${[...uids]})`);
        for (const c of containers(p.template)) {
          if (!/^flotilla:(cpu|cuda)$/.test(c.image)) fail(`${name}: image ${c.image} is not a target of the Dockerfile`);
          const file = c.command?.[0];
          if (file && !fs.existsSync(path.join(stage, file))) fail(`${name}: ${file} is not in the image`);
        }
      }
    }
    const ranks = path.join(stage, 'opt/flotilla/share/flotilla/o200k_base.ranks');
    if (!fs.existsSync(ranks)) fail('image: no tokenizer data at /opt/flotilla/share/flotilla');
    pass('image: the staged files hold every program the manifests run, and the tokenizer data');
  } finally {
    fs.rmSync(stage, { recursive: true, force: true });
  }
}

const all = [];
for (const name of overlays) {
  const objects = render(modules, path.join(k8sDir, 'overlays', name));
  all.push({ name, objects });
  pass(`${name}: rendered ${objects.map((o) => `${o.kind}/${o.metadata.name}`).join(', ')}`);
}
// The RDMA component on both multi-node variants.
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-rdma-'));
try {
  for (const name of ['multi-node', 'multi-node-statefulset']) {
    const rel = path.relative(scratch, k8sDir);
    fs.writeFileSync(path.join(scratch, 'kustomization.yaml'),
      `resources: [${rel}/overlays/${name}]\ncomponents: [${rel}/components/rdma]\n`);
    const objects = render(modules, scratch);
    const text = JSON.stringify(objects);
    if (!text.includes('rdma/rdma_shared_device_a') || !text.includes('NCCL_IB_HCA')) fail(`${name}+rdma: no RDMA resources`);
    all.push({ name: `${name}+rdma`, objects });
    pass(`${name}+rdma: rendered`);
  }
} finally {
  fs.rmSync(scratch, { recursive: true, force: true });
}

for (const { name, objects } of all) {
  const problems = await validate(modules, objects);
  problems.forEach((p) => fail(`${name}: ${p}`));
  if (!problems.length) pass(`${name}: ${objects.length} objects validate`);
  for (const p of podTemplates(objects)) {
    for (const c of containers(p.template)) {
      const where = `${name} ${p.object.kind}/${p.object.metadata.name} container ${c.name}`;
      checkContainer(where, c);
      if (c.command?.[0]?.endsWith('/flotilla-coordinator')) await checkCoordinatorStarts(where, c);
    }
  }
  checkSizes(name, objects);
}
checkImage(all);

if (failures.length) {
  console.log(`\n${failures.length} problem(s):\n${[...new Set(failures)].join('\n')}`);
  process.exit(1);
}
console.log('all manifest checks passed');
