#!/usr/bin/python3
"""test_layer_names.py DMC SOURCE_ROOT: pipeline stages over nested, dotted layer names.

tests/pipeline/hf_layers.dm names its layers as Hugging Face's LLaMA does: the stack is
`model.layers.N` (a repeat layer inside the model's block), around it model.embed_tokens,
model.norm and lm_head. From `dmc --explain=json` (and stderr):

  - automatic cuts: on pipeline=2 (L=4) and pipeline=4 (L=8) every cut falls between two
    members of model.layers (a stage ends with the value a member returns, model.layers.k,
    and the next starts in model.layers.k+1), the stages are within 1.3x of the mean, and
    nothing is warned of. Before layer_key saw model.layers.N, the whole trunk was one
    unit: pipeline=2 put 95% of the work on stage 0.
  - cuts by name: cuts = [model.layers.0] on pipeline=2, and [model.layers.1, model.layers]
    (a member, then the whole stack) on pipeline=3, end the stages where they say, and an
    unbalanced cut the program names is not warned of.
  - a badly unbalanced automatic cut (L=1 on pipeline=3: one decoder layer is most of the
    work) is a warning that names the slowest stage and prints the imbalance --explain
    reports.
  - a cut after a layer called twice is an error saying so.
Exit status: 0 pass, 1 failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile


def explain(dmc, path, args):
    p = subprocess.run([dmc, "--explain=json"] + args + [path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError("dmc %s %s: exit %d\n%s" % (" ".join(args), path, p.returncode, p.stderr))
    return json.loads(p.stdout)["pipeline"], p.stderr


def ends(pipe):
    return [(s["first"], s["last"]) for s in pipe["stage"]]


def layer_of(name):
    m = re.match(r"model\.layers\.(\d+)(\.|$)", name)
    return int(m.group(1)) if m else None


def check_between_layers(pipe, what):
    """Every cut between member k (its result, model.layers.k) and member k + 1."""
    st = ends(pipe)
    for (_, last), (first, _) in zip(st, st[1:]):
        k = layer_of(last)
        if last != "model.layers.%s" % k or layer_of(first) != k + 1:
            raise AssertionError("%s: a cut between '%s' and '%s', not between two layers: %s" % (what, last, first, st))
    if pipe["imbalance"] > 1.3:
        raise AssertionError("%s: imbalance %.2f: %s" % (what, pipe["imbalance"], st))


def with_cuts(src, tmp, cuts, name):
    text = open(src).read().replace("schedule 1f1b(microbatches = 4)",
                                    "schedule 1f1b(microbatches = 4, cuts = [%s])" % cuts)
    path = os.path.join(tmp, name + ".dm")
    with open(path, "w") as f:
        f.write(text)
    return path


def main(argv):
    dmc, root = argv[1], argv[2]
    src = os.path.join(root, "tests", "pipeline", "hf_layers.dm")
    failures = []

    def case(fn, *args):
        try:
            fn(*args)
        except AssertionError as e:
            failures.append(str(e))

    def automatic(mesh, sets):
        pipe, err = explain(dmc, src, ["--mesh", mesh, "--set", sets, "--microbatches", "4"])
        print("automatic %-11s %s: %s, imbalance %.2f" % (mesh, sets, ends(pipe), pipe["imbalance"]))
        if pipe["cuts_by"] != "dmc":
            raise AssertionError("%s: cuts by %s" % (mesh, pipe["cuts_by"]))
        check_between_layers(pipe, mesh)
        if "warning" in err:
            raise AssertionError("%s: a balanced cut warned:\n%s" % (mesh, err))

    case(automatic, "pipeline=2", "L=4")
    case(automatic, "pipeline=4", "L=8")

    def by_name(tmp, cuts, mesh, want_last):
        path = with_cuts(src, tmp, cuts, "cuts%d" % len(want_last))
        pipe, err = explain(dmc, path, ["--mesh", mesh])
        print("cuts = [%s] on %s: %s, imbalance %.2f" % (cuts, mesh, ends(pipe), pipe["imbalance"]))
        got = [last for _, last in ends(pipe)][:-1]
        if pipe["cuts_by"] != "program" or got != want_last:
            raise AssertionError("cuts = [%s]: stages end at %s (cuts by %s), expected %s"
                                 % (cuts, got, pipe["cuts_by"], want_last))
        if "warning" in err:
            raise AssertionError("cuts = [%s]: the program's own cut warned:\n%s" % (cuts, err))

    def unbalanced():
        pipe, err = explain(dmc, src, ["--mesh", "pipeline=3", "--set", "L=1"])
        print("automatic pipeline=3 L=1: %s, imbalance %.2f" % (ends(pipe), pipe["imbalance"]))
        print(err, end="")
        want = "%.2fx the mean of 3 stages" % pipe["imbalance"]
        if pipe["imbalance"] <= 1.5 or "warning: the pipeline stages dmc chose are unbalanced" not in err \
                or want not in err:
            raise AssertionError("L=1 on pipeline=3 (imbalance %.2f): no warning with '%s':\n%s"
                                 % (pipe["imbalance"], want, err))

    def called_twice(tmp):
        text = open(src).read().replace("logits = model(tokens) @ lm_head",
                                        "h = model.norm(model(tokens))\nlogits = model.norm(h) @ lm_head")
        text = text.replace("schedule 1f1b(microbatches = 4)", "schedule 1f1b(microbatches = 4, cuts = [model.norm])")
        path = os.path.join(tmp, "twice.dm")
        with open(path, "w") as f:
            f.write(text)
        p = subprocess.run([dmc, "--check", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
        print(p.stderr.splitlines()[0] if p.stderr else "(no stderr)")
        if p.returncode != 1 or "a cut after layer 'model.norm' needs it called once; it is called 3 times" not in p.stderr:
            raise AssertionError("a cut after a layer called 3 times: exit %d\n%s" % (p.returncode, p.stderr))

    with tempfile.TemporaryDirectory(prefix="dmc-layer-names-") as tmp:
        case(by_name, tmp, "model.layers.0", "pipeline=2", ["model.layers.0"])
        case(by_name, tmp, "model.layers.1, model.layers", "pipeline=3", ["model.layers.1", "model.layers.3"])
        case(unbalanced)
        case(called_twice, tmp)
    for f in failures:
        print("FAIL " + f)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
