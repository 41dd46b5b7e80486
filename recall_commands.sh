#!/usr/bin/env bash
# Re-lint the 15 repositories of benchmarks/field_eval_2026-11-recall20.md at the commits judged there and
# print the finding counts per rule (default rule set, then --select ALL), so the numbers can be compared
# after a change ("after" numbers).
#
# Usage: recall_commands.sh [DDPDOCTOR]      (default: .venv/bin/ddpdoctor of the tree this script is in)
# Needs the snapshots under /work/.mirror (the session's `fetch github:OWNER/NAME` puts them there);
# a missing snapshot or commit is reported and skipped. Checkouts go to /tmp/recall20/<name> (recreated).
set -u
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
ddpdoctor=${1:-$here/.venv/bin/ddpdoctor}
out=${RECALL_OUT:-/tmp/recall20}
mkdir -p "$out"

repos="
aishaeldeeb/MVSS-Net 1c2713fa7d8ae6a40681c41453790b770477b8e5
hwang2006/distributed-training-on-perlmutter-using-horovod e72df5b02e89beab3e7255cfb30541d183caacbf
uabrc/horovod-unet 9ce44b480f6672f05c1a4d532947299859716546
salesforce/ALBEF b9727e43c3040491774d1b22cc27718aa7772fac
jik876/hifi-gan 4769534d45265d52a904b850da5a622601885777
NVIDIA/waveglow 8afb643df59265016af6bd255c7516309d675168
KellerJordan/modded-nanogpt f411b3d346aa52d3504324ca93c230fd84c6c07f
jamesafranke/ViT_clouds b5fa83d2c54055e5512b634cacf7a28efc257029
damo-cv/TransReID dec55046fcdfadee14e2c28e2df89305d8f7557a
JDAI-CV/fast-reid c9bc3ceb2f7a6438b62fb515ea3df6d1e999e95d
yoshitomo-matsubara/torchdistill 3e4373c45214c5c56eebac481d5bfe8b8735aa05
facebookresearch/xcit 82f5291f412604970c39a912586e008ec009cdca
microsoft/Cream 4a13c4091e78f9abd2160e7e01c02e48c1cf8fb9
openai/consistency_models e32b69ee436d518377db86fb2127a3972d0d8716
slitvinov/deepseek-slurm b70623966780a11d8b4f294c8fb83104e4147f34
"

count() {  # $1: JSON report on stdin -> "CODE n" lines
    python3 -c 'import json,sys,collections
r=json.load(sys.stdin)
items=r if isinstance(r,list) else r.get("findings", r.get("diagnostics", []))
c=collections.Counter(f.get("code") or f.get("rule") for f in items)
print(" ".join(f"{k}={v}" for k,v in sorted(c.items())) or "none")'
}

echo "$ddpdoctor"
printf '%-58s %s\n' "repository" "default rules | --select ALL"
while read -r repo commit; do
    [ -z "$repo" ] && continue
    git_dir=/work/.mirror/${repo/\//+}/repo
    name=${repo#*/}
    if ! git -C "$git_dir" cat-file -e "$commit^{commit}" 2>/dev/null; then
        printf '%-58s %s\n' "$repo" "SKIPPED: no snapshot with commit $commit under $git_dir"
        continue
    fi
    rm -rf "${out:?}/$name" && mkdir -p "$out/$name"
    # Snapshots leave their largest blobs out: write only the files whose blob is present.
    python3 - "$git_dir" "$commit" "$out/$name" <<'PY'
import os, subprocess, sys
git_dir, commit, dest = sys.argv[1:]
tree = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "-z", commit], capture_output=True, check=True).stdout
for row in filter(None, tree.split(b"\0")):
    meta, path = row.split(b"\t", 1)
    _mode, kind, blob = meta.split()
    if kind != b"blob":
        continue
    data = subprocess.run(["git", "-C", git_dir, "cat-file", "blob", blob.decode()], capture_output=True)
    if data.returncode:
        continue  # absent from the snapshot
    target = os.path.join(dest.encode(), path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as fh:
        fh.write(data.stdout)
PY
    default=$(cd "$out/$name" && "$ddpdoctor" lint --no-cache --exit-zero --format json . 2>/dev/null | count)
    all=$(cd "$out/$name" && "$ddpdoctor" lint --no-cache --exit-zero --select ALL --format json . 2>/dev/null | count)
    printf '%-58s %s | %s\n' "$repo" "$default" "$all"
done <<< "$repos"
