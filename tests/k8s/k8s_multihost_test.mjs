// Multi-host test without Kubernetes: renders every overlay under
// deploy/k8s/overlays and runs each pod's containers with exactly their
// rendered command, args and environment (downward-API and LWS values filled
// in as the kubelet and the LWS controller would; the GPU overlays on the CPU
// and synthetic:tiny, see forCi), each pod in its own network, UTS, PID and
// mount namespace, linked by veth pairs to a bridge in a namespace of its own
// (10.213.0.0/24, only inside namespaces this test makes), until the instance
// is ready and answers a request; the cpu-demo also loses a worker pod and
// gets it back. Service names resolve through per-namespace hosts files
// (/etc/netns/NAME/hosts). Volumes are directories (tmpfs for Memory) bind-
// mounted at their mountPaths, and the image is deploy/image/stage.sh's
// layout mounted at /opt/flotilla. Probes run as the manifests state them.
// Needs root; exits 77 (skipped) when network namespaces cannot be made.
// Usage: node k8s_multihost_test.mjs BUILD_DIR NODE_MODULES
// On a GPU machine (by hand): K8S_GPU_WORKERS=N keeps the GPU overlays on
// cuda with N workers in all (FLOTILLA_MODEL from K8S_MODEL, default
// synthetic:120b), K8S_OVERLAYS=a,b runs only those overlays, K8S_RENDERED
// (see manifests.mjs) stands in for kubectl, BUILD_DIR may be a bundle
// (tools/bundle.sh: bin/ and share/flotilla/), and the variables named in
// K8S_PASS_ENV (e.g. LD_LIBRARY_PATH for the bundle's libraries in place of
// the image's packages, NCCL_NVLS_ENABLE) reach every container.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { containers, k8sDir, overlays, podTemplates, render, sourceDir } from './manifests.mjs';

const [buildDir, modules] = process.argv.slice(2).map((p) => path.resolve(p));
const tag = `fk${process.pid % 100000}`;
const log = (msg) => console.log(`[${new Date().toISOString().slice(11, 23)}] ${msg}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sh = (cmd, args) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

// --- namespaces, veths, hosts files; every one undone by cleanup() ---------
const made = { namespaces: [], hostsDirs: [], mountDirs: [], procs: [], work: null };
const bridge = `${tag}-br`;
let nextIf = 0;

function addNamespace(name, address) {
  sh('ip', ['netns', 'add', name]);
  made.namespaces.push(name);
  sh('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  if (!address) return;
  const inside = `${tag}a${nextIf}`, outside = `${tag}b${nextIf}`;
  nextIf++;
  sh('ip', ['link', 'add', inside, 'type', 'veth', 'peer', 'name', outside]);
  sh('ip', ['link', 'set', inside, 'netns', name]);
  sh('ip', ['link', 'set', outside, 'netns', bridge]);
  sh('ip', ['-n', name, 'link', 'set', inside, 'name', 'eth0']);
  sh('ip', ['-n', name, 'addr', 'add', `${address}/24`, 'dev', 'eth0']);
  sh('ip', ['-n', name, 'link', 'set', 'eth0', 'up']);
  sh('ip', ['-n', bridge, 'link', 'set', outside, 'master', 'br0', 'up']);
}

function removeNamespace(name) {
  spawnSync('ip', ['netns', 'del', name]);
  made.namespaces = made.namespaces.filter((n) => n !== name);
  fs.rmSync(`/etc/netns/${name}`, { recursive: true, force: true });
}

function writeHosts(name, hosts) {
  const dir = `/etc/netns/${name}`;
  fs.mkdirSync(dir, { recursive: true });
  made.hostsDirs.push(dir);
  const lines = ['127.0.0.1 localhost', ...Object.entries(hosts).map(([n, ip]) => `${ip} ${n}`)];
  fs.writeFileSync(`${dir}/hosts`, `${lines.join('\n')}\n`);
}

function cleanup() {
  for (const p of made.procs) { try { process.kill(p.pid, 'SIGKILL'); } catch {} }
  for (const n of [...made.namespaces].reverse()) removeNamespace(n);
  for (const d of made.hostsDirs) fs.rmSync(d, { recursive: true, force: true });
  for (const d of made.mountDirs.reverse()) { try { fs.rmSync(d, { recursive: true }); } catch {} }
  if (made.work) fs.rmSync(made.work, { recursive: true, force: true });
}
process.on('SIGTERM', () => { cleanup(); process.exit(1); });
process.on('SIGINT', () => { cleanup(); process.exit(1); });

// --- pods: environment as the kubelet makes it ------------------------------
// $(VAR) references to variables defined before (or injected), $$ escapes.
function expand(text, vars) {
  return text.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name) =>
    (m === '$$' ? '$' : name in vars ? vars[name] : m));
}

function containerEnv(c, pod) {
  const vars = { ...pod.injected };
  for (const e of c.env ?? []) {
    if (e.valueFrom?.fieldRef) {
      const field = e.valueFrom.fieldRef.fieldPath;
      const known = { 'metadata.name': pod.name, 'status.podIP': pod.ip, 'spec.nodeName': pod.node,
        'metadata.namespace': 'default' };
      if (!(field in known)) throw new Error(`${pod.name}: fieldRef ${field} not handled by this test`);
      vars[e.name] = known[field];
    } else if (e.valueFrom) {
      throw new Error(`${pod.name}: ${e.name} uses ${Object.keys(e.valueFrom)} (not handled by this test)`);
    } else {
      vars[e.name] = expand(e.value ?? '', vars);
    }
  }
  return vars;
}

const quote = (s) => `'${String(s).replace(/'/g, `'\\''`)}'`;

// Records the directories a mountPath would create on the host, to remove them.
function mountPoint(target) {
  let top = null;
  for (let p = target; p !== '/'; p = path.dirname(p)) if (!fs.existsSync(p)) top = p;
  if (top) made.mountDirs.push(top);
}

// The shell line that sets up one container's namespaces and execs it.
function containerScript(c, pod) {
  const env = containerEnv(c, pod);
  const lines = ['set -e', `hostname ${quote(pod.name)}`,
    'mount -t tmpfs -o size=64m tmpfs /dev/shm',
    'mkdir -p /opt/flotilla', `mount --bind ${quote(`${made.work}/image/opt/flotilla`)} /opt/flotilla`];
  mountPoint('/opt/flotilla');
  for (const m of c.volumeMounts ?? []) {
    const volume = pod.template.spec.volumes.find((v) => v.name === m.name);
    const dir = pod.volumes[m.name];
    mountPoint(m.mountPath);
    lines.push(`mkdir -p ${quote(m.mountPath)}`);
    if (volume.emptyDir?.medium === 'Memory') lines.push(`mount -t tmpfs tmpfs ${quote(m.mountPath)}`);
    else lines.push(`mount --bind ${quote(dir)} ${quote(m.mountPath)}`);
  }
  const argv = [...c.command, ...(c.args ?? [])].map((a) => quote(expand(a, env)));
  const passed = (process.env.K8S_PASS_ENV ?? '').split(',').filter((k) => k && k in process.env)
    .map((k) => [k, process.env[k]]);
  const envs = [...Object.entries(env), ...passed].map(([k, v]) => quote(`${k}=${v}`));
  lines.push(`exec env -i PATH=/opt/flotilla/bin:/usr/bin:/bin ${envs.join(' ')} ${argv.join(' ')}`);
  return { script: lines.join('\n'), argv, env };
}

function volumesOf(pod) {
  const dirs = {};
  for (const v of pod.template.spec.volumes ?? []) {
    const dir = path.join(made.work, 'pods', pod.name, v.name);
    fs.mkdirSync(dir, { recursive: true });
    if (v.secret) fs.writeFileSync(path.join(dir, 'token'), `${made.token}\n`, { mode: 0o600 });
    dirs[v.name] = dir;
  }
  return dirs;
}

function runContainer(pod, c, wait) {
  const { script, argv, env } = containerScript(c, pod);
  log(`pod ${pod.name} (${pod.ip}) container ${c.name}: ${argv.join(' ')}`);
  log(`  env: ${Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ')}`);
  const cmd = ['netns', 'exec', pod.ns, 'unshare', '--uts', '--ipc', '--pid', '--fork', '--kill-child',
    '--mount-proc', 'sh', '-c', script];
  const logFile = path.join(made.work, `${pod.name}-${c.name}.log`);
  if (wait) {
    const r = spawnSync('ip', cmd, { encoding: 'utf8' });
    fs.writeFileSync(logFile, `${r.stdout}${r.stderr}`);
    if (r.status !== 0) throw new Error(`init container ${c.name} of ${pod.name} failed: ${r.stderr}`);
    return null;
  }
  const out = fs.openSync(logFile, 'a');
  const proc = spawn('ip', cmd, { stdio: ['ignore', out, out] });
  made.procs.push(proc);
  return proc;
}

function startPod(pod) {
  addNamespace(pod.ns, pod.ip);
  writeHosts(pod.ns, pod.hosts);
  pod.volumes = volumesOf(pod);
  for (const c of pod.template.spec.initContainers ?? []) runContainer(pod, c, true);
  pod.procs = pod.template.spec.containers.map((c) => runContainer(pod, c, false));
}

function killPod(pod) {
  for (const p of pod.procs) p.kill('SIGKILL');
  removeNamespace(pod.ns);
}

// --- probes and requests from the client namespace --------------------------
function probe(...args) {
  const r = spawnSync('ip', ['netns', 'exec', `${tag}-client`, process.execPath,
    path.join(sourceDir, 'tests/k8s/probe.mjs'), modules, ...args], { encoding: 'utf8', timeout: 90000 });
  try { return JSON.parse(r.stdout.trim().split('\n').pop()); } catch { return { status: 0, error: r.stderr }; }
}

function portOf(container, port) {
  return typeof port === 'number' ? port : container.ports.find((p) => p.name === port).containerPort;
}
const readiness = (pod, c) => probe('http', `http://${pod.ip}:${portOf(c, c.readinessProbe.httpGet.port)}${c.readinessProbe.httpGet.path}`);
const liveness = (pod, c) => probe('grpc-health', `${pod.ip}:${portOf(c, c.livenessProbe.grpc.port)}`, c.livenessProbe.grpc.service ?? '');

async function until(what, seconds, test) {
  const end = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < end) {
    last = test();
    if (last.ok) return last;
    await sleep(500);
  }
  throw new Error(`${what}: not within ${seconds} s (last: ${JSON.stringify(last.value)})`);
}

function showConnections(pods) {
  for (const pod of pods) {
    const ss = spawnSync('ip', ['netns', 'exec', pod.ns, 'ss', '-tnH', 'state', 'established'], { encoding: 'utf8' });
    const lines = ss.stdout.trim().split('\n').filter((l) => l.includes('10.213.'));
    log(`TCP connections in ${pod.name} (${pod.ip}):`);
    for (const l of lines) log(`  ${l.trim().split(/\s+/).slice(-2).join(' <-> ')}`);
  }
}

function checkCrossing(pods) {
  // Each worker pod holds TCP connections to another pod: the coordinator
  // session and the UCX peers (when it has peers outside the pod).
  for (const pod of pods.filter((p) => p.worker)) {
    const ss = spawnSync('ip', ['netns', 'exec', pod.ns, 'ss', '-tnH', 'state', 'established'], { encoding: 'utf8' });
    // gRPC's dual-stack sockets show IPv4 peers as [::ffff:A.B.C.D]:PORT.
    const remote = ss.stdout.split('\n').map((l) => l.trim().split(/\s+/).pop()?.replace(/^\[::ffff:([0-9.]+)\]/, '$1'))
      .filter((r) => r && r.startsWith('10.213.') && !r.startsWith(`${pod.ip}:`));
    if (!remote.length) throw new Error(`${pod.name}: no TCP connection to another pod`);
  }
}

async function chat(url, model) {
  const reply = probe('chat', url, model, 'Say hi');
  if (reply.status !== 200) throw new Error(`chat via ${url}: ${JSON.stringify(reply)}`);
  const body = JSON.parse(reply.body);
  log(`chat via ${url} from the client namespace: HTTP 200, finish_reason ${body.choices[0].finish_reason}, ` +
      `${body.usage.completion_tokens} tokens, content ${JSON.stringify(body.choices[0].message.content)}`);
}

// --- scenarios ----------------------------------------------------------------
function services(objects, coordinatorIp) {
  const hosts = {};
  for (const s of objects.filter((o) => o.kind === 'Service' && o.spec.clusterIP !== 'None')) {
    hosts[s.metadata.name] = coordinatorIp;  // every Service here selects the coordinator
    hosts[`${s.metadata.name}.default.svc.cluster.local`] = coordinatorIp;
  }
  return hosts;
}

async function cpuDemo() {
  log('=== cpu-demo ===');
  const objects = render(modules, path.join(k8sDir, 'overlays/cpu-demo'));
  const [coord] = podTemplates(objects).filter((p) => p.object.kind === 'Deployment');
  const [workers] = podTemplates(objects).filter((p) => p.object.kind === 'StatefulSet');
  const hosts = services(objects, '10.213.0.10');
  const pod = (name, ip, template, worker) => ({ name, ns: `${tag}-${name.slice(-12)}`, ip, node: `node-${name}`, template, worker, injected: {}, hosts });
  const coordinator = pod('flotilla-coordinator-5d4c8-x2k9p', '10.213.0.10', coord.template, false);
  const workerPods = [...Array(workers.replicas).keys()].map((i) => pod(`flotilla-worker-${i}`, `10.213.0.${11 + i}`, workers.template, true));
  workerPods.forEach((w) => { hosts[`${w.name}.flotilla-worker`] = w.ip; });
  const c = coord.template.spec.containers[0];
  const model = c.env.find((e) => e.name === 'FLOTILLA_MODEL').value.split('/').pop();

  writeHosts(`${tag}-client`, hosts);
  startPod(coordinator);
  await until('startup probe (gRPC health "") SERVING', 60, () => { const v = liveness(coordinator, c); return { ok: v.status === 'SERVING', value: v }; });
  const waiting = readiness(coordinator, c);
  log(`readiness before any worker: HTTP ${waiting.status} ${waiting.body}`);
  if (waiting.status !== 503) throw new Error('ready without workers');
  workerPods.forEach(startPod);
  await until('readiness (/health) 200', 180, () => { const v = readiness(coordinator, c); return { ok: v.status === 200, value: v }; });
  log('instance ready: /health 200');
  await chat('http://flotilla:8000/v1/chat/completions', model);
  showConnections([coordinator, ...workerPods]);
  checkCrossing(workerPods);

  const victim = workerPods[1];
  log(`killing pod ${victim.name} (SIGKILL, namespace removed)`);
  killPod(victim);
  const down = await until('readiness 503 after the kill', 30, () => { const v = readiness(coordinator, c); return { ok: v.status === 503, value: v }; });
  log(`readiness with ${victim.name} gone: HTTP ${down.value.status} ${down.value.body}`);
  const live = liveness(coordinator, c);
  log(`liveness meanwhile: ${live.status}`);
  if (live.status !== 'SERVING') throw new Error('liveness failed while a worker was gone');

  victim.ip = '10.213.0.21';  // a recreated pod gets a new IP
  hosts[`${victim.name}.flotilla-worker`] = victim.ip;
  log(`restarting pod ${victim.name} with the same spec at ${victim.ip}`);
  startPod(victim);
  await until('readiness 200 after the restart', 180, () => { const v = readiness(coordinator, c); return { ok: v.status === 200, value: v }; });
  log('instance ready again: /health 200');
  await chat('http://flotilla.default.svc.cluster.local:8000/v1/chat/completions', model);
  showConnections([victim]);
  checkCrossing([victim]);
  for (const p of [coordinator, ...workerPods]) killPod(p);
}

// --- every overlay, as CI can run it ---------------------------------------
// The rendered pods keep their exact command lines and environment but for
// three values: GPU workers run on the CPU (FLOTILLA_DEVICE=cpu), the
// coordinator serves synthetic:tiny (generated by the workers: no checkpoint
// claim), and an instance larger than kMaxRanks keeps its pod count with
// fewer workers per pod (tiny has 8 experts, CI machines few cores).
const kMaxRanks = 4;

function setEnv(c, name, value) {
  const e = c.env?.find((x) => x.name === name);
  if (e) e.value = value;
  return Boolean(e);
}

function forCi(objects) {
  const out = structuredClone(objects);
  const pods = podTemplates(out);
  const all = pods.flatMap((p) => p.template.spec.containers);
  const coordinator = all.find((c) => c.command?.[0]?.endsWith('/flotilla-coordinator'));
  const total = Number(coordinator.env.find((e) => e.name === 'FLOTILLA_WORKERS').value);
  const perPod = Number(all.find((c) => c.command?.[0]?.endsWith('/flotilla-pod-workers'))
    .env.find((e) => e.name === 'FLOTILLA_WORKERS_PER_POD')?.value ?? 1);
  const podCount = total / perPod;
  const scaled = total > kMaxRanks ? Math.max(1, Math.floor(kMaxRanks / podCount)) : perPod;
  for (const c of all) {
    setEnv(c, 'FLOTILLA_DEVICE', 'cpu');
    setEnv(c, 'FLOTILLA_WORKERS_PER_POD', String(scaled));
  }
  setEnv(coordinator, 'FLOTILLA_MODEL', 'synthetic:tiny');
  setEnv(coordinator, 'FLOTILLA_WORKERS', String(podCount * scaled));
  return { objects: out, workers: podCount * scaled, coordinator };
}

// On a GPU machine: the GPU overlays as rendered, but for the instance's
// size (K8S_GPU_WORKERS in all, the pods' count kept where it divides) and
// the model (no checkpoint here).
const gpuWorkers = Number(process.env.K8S_GPU_WORKERS ?? 0);
const gpuModel = process.env.K8S_MODEL ?? 'synthetic:120b';

function forGpu(objects) {
  const out = structuredClone(objects);
  const all = podTemplates(out).flatMap((p) => p.template.spec.containers);
  const coordinator = all.find((c) => c.command?.[0]?.endsWith('/flotilla-coordinator'));
  const total = Number(coordinator.env.find((e) => e.name === 'FLOTILLA_WORKERS').value);
  const perPod = Number(all.find((c) => c.command?.[0]?.endsWith('/flotilla-pod-workers'))
    .env.find((e) => e.name === 'FLOTILLA_WORKERS_PER_POD')?.value ?? 1);
  const podCount = total / perPod;
  if (gpuWorkers % podCount !== 0) throw new Error(`${gpuWorkers} GPU workers do not fill ${podCount} pods`);
  for (const c of all) setEnv(c, 'FLOTILLA_WORKERS_PER_POD', String(gpuWorkers / podCount));
  setEnv(coordinator, 'FLOTILLA_MODEL', gpuModel);
  setEnv(coordinator, 'FLOTILLA_WORKERS', String(gpuWorkers));
  return { objects: out, workers: gpuWorkers, coordinator };
}

async function complete(url, model) {
  const reply = probe('complete', url, model, '[1,2,3,4]');
  if (reply.status !== 200) throw new Error(`completion via ${url}: ${JSON.stringify(reply)}`);
  const body = JSON.parse(reply.body);
  log(`completion via ${url} from the client namespace: HTTP 200, finish_reason ` +
      `${body.choices[0].finish_reason}, ${body.usage.completion_tokens} tokens`);
}

// Pods of a Deployment (the coordinator) and a StatefulSet (the workers).
function statefulSetPods(objects, base) {
  const [coord] = podTemplates(objects).filter((p) => p.object.kind === 'Deployment');
  const [workers] = podTemplates(objects).filter((p) => p.object.kind === 'StatefulSet');
  const hosts = services(objects, `10.213.0.${base}`);
  const pod = (name, ip, template, worker) => ({ name, ns: `${tag}-${name.slice(-12)}`, ip, node: `node-${name}`, template, worker, injected: {}, hosts });
  const coordinator = pod('flotilla-coordinator-5d4c8-x2k9p', `10.213.0.${base}`, coord.template, false);
  const workerPods = [...Array(workers.replicas).keys()].map((i) => pod(`flotilla-worker-${i}`, `10.213.0.${base + 1 + i}`, workers.template, true));
  workerPods.forEach((w) => { hosts[`${w.name}.flotilla-worker`] = w.ip; });
  return { hosts, coordinator, pods: [coordinator, ...workerPods] };
}

// Pods of one LeaderWorkerSet group, with what the LWS controller injects.
function leaderWorkerSetPods(objects, base) {
  const lws = objects.find((o) => o.kind === 'LeaderWorkerSet');
  const size = lws.spec.leaderWorkerTemplate.size;
  const leaderName = `${lws.metadata.name}-0`;
  const leaderAddress = `${leaderName}.${lws.metadata.name}.default`;
  const hosts = { ...services(objects, `10.213.0.${base}`), [leaderAddress]: `10.213.0.${base}` };
  const pods = [...Array(size).keys()].map((i) => ({
    name: i === 0 ? leaderName : `${leaderName}-${i}`, ns: `${tag}-lws${i}`, ip: `10.213.0.${base + i}`,
    node: `node-${i}`, worker: true, hosts,
    template: i === 0 ? lws.spec.leaderWorkerTemplate.leaderTemplate : lws.spec.leaderWorkerTemplate.workerTemplate,
    injected: { LWS_LEADER_ADDRESS: leaderAddress, LWS_GROUP_SIZE: String(size), LWS_WORKER_INDEX: String(i) },
  }));
  for (let i = 1; i < size; i++) hosts[`${pods[i].name}.${lws.metadata.name}`] = pods[i].ip;
  return { hosts, coordinator: pods[0], pods };
}

// Starts every pod of `name`'s overlay, waits until its coordinator is ready
// and has answered a completion, then removes the pods.
async function formsAnInstance(name, base) {
  const rendered = render(modules, path.join(k8sDir, 'overlays', name));
  const { objects, workers, coordinator: c } = gpuWorkers ? forGpu(rendered) : forCi(rendered);
  const model = gpuWorkers ? gpuModel : 'synthetic:tiny';
  log(`=== ${name}: ${workers} ${gpuWorkers ? 'GPU' : 'CPU'} workers on ${model} ===`);
  const lws = objects.some((o) => o.kind === 'LeaderWorkerSet');
  const { hosts, coordinator, pods } = lws ? leaderWorkerSetPods(objects, base) : statefulSetPods(objects, base);
  if (gpuWorkers) {
    // What the device plugin gives each pod: GPUs of its own, in pod order.
    const workerPods = pods.filter((p) => p.worker);
    const each = gpuWorkers / workerPods.length;
    workerPods.forEach((p, i) => {
      p.injected.CUDA_VISIBLE_DEVICES = [...Array(each).keys()].map((g) => i * each + g).join(',');
    });
  }
  writeHosts(`${tag}-client`, hosts);
  pods.forEach(startPod);
  await until(`${name}: readiness (/health) 200`, 180, () => { const v = readiness(coordinator, c); return { ok: v.status === 200, value: v }; });
  log(`${name}: instance ready: /health 200`);
  await complete('http://flotilla:8000/v1/completions', model);
  checkCrossing(pods.filter((p) => p.worker && p !== coordinator));
  pods.forEach(killPod);
}

// --- main ---------------------------------------------------------------------
try {
  sh('ip', ['netns', 'add', bridge]);
  made.namespaces.push(bridge);
} catch (e) {
  console.log(`SKIP: cannot make network namespaces here (${String(e.stderr ?? e).trim()})`);
  process.exit(77);
}
let failed = false;
try {
  sh('ip', ['-n', bridge, 'link', 'add', 'br0', 'type', 'bridge']);
  sh('ip', ['-n', bridge, 'link', 'set', 'br0', 'up']);
  addNamespace(`${tag}-client`, '10.213.0.100');
  made.work = fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-k8s-'));
  fs.chmodSync(made.work, 0o755);
  made.token = execFileSync('openssl', ['rand', '-hex', '32'], { encoding: 'utf8' }).trim();
  execFileSync(path.join(sourceDir, 'deploy/image/stage.sh'), [path.join(made.work, 'image'), buildDir], { stdio: 'inherit' });
  const chosen = process.env.K8S_OVERLAYS ? process.env.K8S_OVERLAYS.split(',') : overlays;
  if (chosen.includes('cpu-demo')) await cpuDemo();
  let base = 30;
  for (const name of chosen.filter((o) => o !== 'cpu-demo')) {
    await formsAnInstance(name, base);
    base += 10;
  }
  log('PASS');
} catch (e) {
  failed = true;
  log(`FAIL: ${e.stack ?? e}`);
  if (made.work) {
    for (const f of fs.readdirSync(made.work).filter((x) => x.endsWith('.log'))) {
      log(`--- ${f} (last 30 lines)`);
      console.log(fs.readFileSync(path.join(made.work, f), 'utf8').split('\n').slice(-30).join('\n'));
    }
  }
} finally {
  cleanup();
}
process.exit(failed ? 1 : 0);
