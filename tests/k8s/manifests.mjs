// Renders the deploy/k8s overlays and reads what their pods would run: the
// objects, their schemas, and each container's command, args and environment.
// Shared by k8s_manifests_test.mjs and k8s_multihost_test.mjs.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

export const sourceDir = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
export const k8sDir = path.join(sourceDir, 'deploy/k8s');
export const overlays = ['cpu-demo', 'single-node', 'multi-node', 'multi-node-statefulset'];

// Renders a kustomization directory into plain objects. With
// K8S_RENDERED=DIR set, reads DIR/<overlay>.json instead (written here by
// `node manifests.mjs --dump DIR MODULES`, for a machine without kubectl).
export function render(modules, dir) {
  if (process.env.K8S_RENDERED) {
    const file = path.join(process.env.K8S_RENDERED, `${path.basename(dir)}.json`);
    return JSON.parse(fs.readFileSync(file, 'utf8'));
  }
  const yaml = createRequire(path.join(modules, 'x.js'))('yaml');
  const text = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8' });
  return yaml.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
}

// The core kinds whose schemas kubernetes-models holds, by apiVersion/kind.
const coreModels = {
  'v1/Service': 'v1/Service', 'v1/ConfigMap': 'v1/ConfigMap', 'v1/Secret': 'v1/Secret',
  'apps/v1/Deployment': 'apps/v1/Deployment', 'apps/v1/StatefulSet': 'apps/v1/StatefulSet',
};

async function model(modules, name) {
  const file = path.join(modules, 'kubernetes-models', `${name}.js`);
  const exported = await import(pathToFileURL(file).href);
  return exported[path.basename(name)];
}

// Validates every object: core kinds against their OpenAPI schemas; a
// LeaderWorkerSet (a CRD kubernetes-models lacks) by its fields and its two pod
// templates against PodTemplateSpec. Returns the problems found.
export async function validate(modules, objects) {
  const problems = [];
  const check = async (kind, value, what) => {
    try {
      new (await model(modules, kind))(value).validate();
    } catch (e) {
      problems.push(`${what}: ${e.message}`);
    }
  };
  for (const o of objects) {
    const key = `${o.apiVersion}/${o.kind}`;
    const what = `${o.kind}/${o.metadata?.name}`;
    if (coreModels[key]) {
      await check(coreModels[key], o, what);
    } else if (key === 'leaderworkerset.x-k8s.io/v1/LeaderWorkerSet') {
      const t = o.spec?.leaderWorkerTemplate;
      if (!Number.isInteger(t?.size) || t.size < 1) problems.push(`${what}: size must be a positive integer`);
      if (!t?.workerTemplate) problems.push(`${what}: no workerTemplate`);
      for (const name of ['leaderTemplate', 'workerTemplate']) {
        if (t?.[name]) await check('v1/PodTemplateSpec', t[name], `${what} ${name}`);
      }
    } else {
      problems.push(`${what}: no schema for ${key}`);
    }
  }
  return problems;
}

// Every pod template of the rendered objects: {object, role, template, replicas}.
export function podTemplates(objects) {
  const out = [];
  for (const o of objects) {
    if (o.kind === 'Deployment' || o.kind === 'StatefulSet') {
      out.push({ object: o, role: o.kind, template: o.spec.template, replicas: o.spec.replicas ?? 1 });
    } else if (o.kind === 'LeaderWorkerSet') {
      const t = o.spec.leaderWorkerTemplate;
      out.push({ object: o, role: 'leader', template: t.leaderTemplate, replicas: o.spec.replicas ?? 1 });
      out.push({ object: o, role: 'worker', template: t.workerTemplate, replicas: (o.spec.replicas ?? 1) * (t.size - 1) });
    }
  }
  return out;
}

// Containers (init containers first) of a pod template.
export function containers(template) {
  return [...(template.spec.initContainers ?? []), ...template.spec.containers];
}

export function envValue(container, name) {
  return container.env?.find((e) => e.name === name)?.value;
}

// node manifests.mjs --dump DIR MODULES: every overlay rendered to DIR/<name>.json.
if (process.argv[1] === new URL(import.meta.url).pathname && process.argv[2] === '--dump') {
  const [dir, modules] = process.argv.slice(3).map((p) => path.resolve(p));
  fs.mkdirSync(dir, { recursive: true });
  for (const name of overlays) {
    fs.writeFileSync(path.join(dir, `${name}.json`), JSON.stringify(render(modules, path.join(k8sDir, 'overlays', name))));
  }
}
