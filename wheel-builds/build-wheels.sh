#!/usr/bin/env bash
#
# Builds torch and torch_xla from source for one wheel build, as upstream pytorch/xla builds its release wheels,
# checks the ABI of both wheels, and only then copies them into the output wheelhouse. Run it with --help.
#
# This script is the same for every wheel build. What differs, the (release, python, ABI), is in the parameter
# file wheel-builds/<build>.env that `./build.py render` writes from matrix.yaml; the cpu and tpu flavours of
# one release, python and ABI share one. By default the build runs inside the builder image of the Dockerfile
# next to this script (the toolchain is pinned there), as upstream builds its wheels in a development image;
# --host runs it with the tools of this machine.
#
# How the ABI is chosen, as upstream does:
#   torch      _GLIBCXX_USE_CXX11_ABI=$ABI_FLAG in the environment of `python setup.py bdist_wheel`.
#   torch_xla  CXX_ABI=$ABI_FLAG, which its setup.py passes to bazel as --cxxopt=-D_GLIBCXX_USE_CXX11_ABI=...;
#              the same flag also goes into xla/.bazelrc.user (upstream's .bazelrc try-imports it), so every
#              bazel action agrees.
# How the wheels are named: with upstream's version variables, not by renaming files afterwards, so the file
# name, the wheel metadata and torch.__version__ agree. PYTORCH_BUILD_VERSION (with PYTORCH_BUILD_NUMBER=1)
# and TORCH_XLA_VERSION (with GIT_VERSIONED_XLA_BUILD=false, so no +git<sha> is appended) are the release
# plus upstream's local label for a build in the release's non-default ABI: "+cxx11" for 2.6, "+precxx11"
# from 2.7, nothing for the default ABI. The script stops if the built file names say otherwise.
set -euo pipefail

readonly PYTORCH_REPO=${PYTORCH_REPO:-https://github.com/pytorch/pytorch.git}
readonly XLA_REPO=${XLA_REPO:-https://github.com/pytorch/xla.git}
# Every parameter file sets these (render writes them; a hand-edited file that lacks one is refused).
readonly PARAMETERS=(WHEEL_BUILD FLAVOURS PYTHON_VERSION ABI ABI_FLAG PYTORCH_REV XLA_REV TORCH_VERSION
    TORCH_XLA_VERSION_WANTED BUILDER_BASE_IMAGE)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
    cat <<EOF
Usage: build-wheels.sh BUILD [--workdir DIR] [--output DIR] [--jobs N] [--python CMD] [--host] [--dry-run]

Build torch and torch_xla from source for the wheel build BUILD: a name such as r2.9.0_3.11_cxx11 (its
parameter file is wheel-builds/BUILD.env, written by ./build.py render) or the path of a parameter file.
Builds here: $(builds)

Options:
  --workdir DIR   sources, build venv and build trees (default: build/wheels/BUILD in the repository).
                  Reused on a second run when its checkouts are at the same revisions.
  --output DIR    wheelhouse the two checked wheels are copied to (default: wheelhouse/built in the
                  repository, where the wheel source of site_defaults.yaml looks for them).
  --jobs N        parallel compile jobs, for torch (MAX_JOBS) and bazel (BAZEL_JOBS) (default: all CPUs).
  --python CMD    the python to build with; a venv is made from it (default: pythonX.Y of the build).
  --host          build with the tools of this machine, not inside the builder image.
  --dry-run       print every command of the plan, run nothing.
  -h, --help      this text.

In the builder image (the default): needs docker. The image is built from wheel-builds/Dockerfile with the
parameter file's BUILDER_BASE_IMAGE (tag: \$BUILDER_IMAGE, default xla-images/wheel-builder:<python>); the
repository, the workdir and the output are mounted at their own paths inside it.
With --host: needs git, bazel (or bazelisk named bazel), a C++ toolchain, python X.Y with venv.
Either way: network access to the source repositories and the package index; hours of CPU time, ~40 GB of disk.
Environment: PYTORCH_REPO, XLA_REPO (clone URLs), ABI_TOOL (the ABI checker: the xla_images/abi package directory or
its one-file copy abi.pyz; default: abi.pyz next to this script, else \$XLA_IMAGES_ROOT/xla_images/abi), ABI_PYTHON
(python that runs it; default: the build venv).

Afterwards: ./build.py lock FLAVOUR..., then ./build.py build FLAVOUR... (the flavours the build prints).
EOF
}

die() {
    printf 'build-wheels.sh: error: %s\n' "$*" >&2
    exit 1
}

usage_error() {
    printf 'build-wheels.sh: error: %s\n' "$*" >&2
    exit 2
}

note() {
    printf 'build-wheels.sh: %s\n' "$*" >&2
}

step() {
    printf '==> %s\n' "$*"
}

# The names of the parameter files next to this script.
builds() {
    local file names=()
    for file in "$here"/*.env; do
        if [[ -f $file ]]; then
            names+=("$(basename "$file" .env)")
        fi
    done
    printf '%s\n' "${names[*]:-none (run ./build.py render)}"
}

# Print a command the way a shell would read it back, then run it unless this is a dry run.
run() {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
    if [[ $dry_run == 0 ]]; then
        "$@"
    fi
}

run_in() {
    local dir=$1
    shift
    printf '+ cd %q &&' "$dir"
    printf ' %q' "$@"
    printf '\n'
    if [[ $dry_run == 0 ]]; then
        (cd "$dir" && "$@")
    fi
}

write_file() {
    local path=$1 text=$2
    printf '+ write %q:\n' "$path"
    printf '%s\n' "$text" | sed 's/^/    /'
    if [[ $dry_run == 0 ]]; then
        printf '%s\n' "$text" >"$path"
    fi
}

absolute() {
    case $1 in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s/%s\n' "$PWD" "$1" ;;
    esac
}

option_value() {
    [[ $# -ge 2 && $2 != --* ]] || usage_error "$1 needs a value (see --help)"
    printf '%s\n' "$2"
}

# Read the parameter file of BUILD (a name or a path); refuse one that lacks a parameter.
load_parameters() {
    local build=$1 file name
    case $build in
        */* | *.env) file=$(absolute "$build") ;;
        *) file=$here/$build.env ;;
    esac
    [[ -f $file ]] || usage_error "no wheel build '$build': $file does not exist. Builds here: $(builds)"
    # shellcheck source=/dev/null # a parameter file rendered from templates/wheel-build.env.j2
    source "$file" || die "$file could not be read"
    for name in "${PARAMETERS[@]}"; do
        [[ -n ${!name:-} ]] || die "$file does not set $name; regenerate it with ./build.py render"
    done
    [[ $ABI_FLAG == 0 || $ABI_FLAG == 1 ]] || die "$file: ABI_FLAG must be 0 or 1, not '$ABI_FLAG'"
    parameters_file=$file
}

dry_run=0
host=0
build=
workdir=
output=
jobs=
python_cmd=
while [[ $# -gt 0 ]]; do
    case $1 in
        --workdir) workdir=$(option_value "$@"); shift 2 ;;
        --workdir=*) workdir=${1#*=}; shift ;;
        --output) output=$(option_value "$@"); shift 2 ;;
        --output=*) output=${1#*=}; shift ;;
        --jobs) jobs=$(option_value "$@"); shift 2 ;;
        --jobs=*) jobs=${1#*=}; shift ;;
        --python) python_cmd=$(option_value "$@"); shift 2 ;;
        --python=*) python_cmd=${1#*=}; shift ;;
        --host) host=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) usage_error "unknown argument: $1 (see --help)" ;;
        *)
            [[ -z $build ]] || usage_error "one wheel build at a time, not '$build' and '$1' (see --help)"
            build=$1
            shift
            ;;
    esac
done
[[ -n $build ]] || usage_error "name the wheel build, e.g. build-wheels.sh r2.9.0_3.11_cxx11 (see --help). Builds here: $(builds)"
load_parameters "$build"
readonly WHEEL_BUILD FLAVOURS PYTHON_VERSION ABI ABI_FLAG PYTORCH_REV XLA_REV TORCH_VERSION \
    TORCH_XLA_VERSION_WANTED BUILDER_BASE_IMAGE parameters_file
readonly PYTHON_TAG=cp${PYTHON_VERSION//./}

root=${XLA_IMAGES_ROOT:-$(cd "$here/.." && pwd)}
workdir=$(absolute "${workdir:-$root/build/wheels/$WHEEL_BUILD}")
output=$(absolute "${output:-$root/wheelhouse/built}")
jobs=${jobs:-$(nproc)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || usage_error "--jobs must be a positive number, not '$jobs'"
python_cmd=${python_cmd:-python$PYTHON_VERSION}
builder_image=${BUILDER_IMAGE:-xla-images/wheel-builder:$PYTHON_VERSION}
if [[ -z ${ABI_TOOL:-} ]]; then
    if [[ -f $here/abi.pyz ]]; then
        ABI_TOOL=$here/abi.pyz
    else
        ABI_TOOL=$root/xla_images/abi
    fi
fi
venv=$workdir/venv
py=$venv/bin/python
abi_python=${ABI_PYTHON:-$py}
pytorch_src=$workdir/pytorch
xla_src=$pytorch_src/xla

preflight() {
    local missing=() tool actual tools=(docker)
    if [[ $host == 1 ]]; then
        tools=(git bazel "$python_cmd")
    fi
    for tool in "${tools[@]}"; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [[ $dry_run == 1 ]]; then
        if [[ ${#missing[@]} -gt 0 ]]; then
            note "not on PATH (a real run needs them): ${missing[*]}"
        fi
        return 0
    fi
    if [[ $host == 0 ]]; then
        [[ ${#missing[@]} == 0 ]] || die "not on PATH: docker. Install it, or pass --host to build with this machine's tools."
        return 0
    fi
    [[ ${#missing[@]} == 0 ]] || die "not on PATH: ${missing[*]}. Install them (bazel: use bazelisk, installed as 'bazel'), or build in the builder image (drop --host)."
    [[ -e $ABI_TOOL ]] || die "the ABI checker $ABI_TOOL does not exist; set ABI_TOOL to the xla_images/abi directory (or abi.pyz, its one-file copy) or XLA_IMAGES_ROOT to the repository"
    actual=$("$python_cmd" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "$python_cmd does not run"
    [[ $actual == "$PYTHON_VERSION" ]] || die "$python_cmd is python $actual, this build needs $PYTHON_VERSION (pass --python)"
}

# Build the builder image, then run this script with --host inside it. The repository, the workdir and the
# output are mounted at their own paths, so every path of the plan means the same inside and out.
in_builder() {
    local mounts=() dir name
    local environment=(-e "HOME=$workdir/home" -e "XLA_IMAGES_ROOT=$root")
    for dir in "$root" "$workdir" "$output"; do
        mounts+=(-v "$dir:$dir")
    done
    for name in PYTORCH_REPO XLA_REPO ABI_TOOL ABI_PYTHON; do
        if [[ -n ${!name:-} ]]; then
            environment+=(-e "$name=${!name}")
        fi
    done
    step "builder image $builder_image (toolchain of wheel-builds/Dockerfile)"
    run docker build --build-arg "BASE_IMAGE=$BUILDER_BASE_IMAGE" --tag "$builder_image" "$here"
    run mkdir -p "$workdir/home" "$output"
    run docker run --rm --user "$(id -u):$(id -g)" "${mounts[@]}" "${environment[@]}" --workdir "$root" \
        "$builder_image" bash "$here/build-wheels.sh" "$parameters_file" --host --workdir "$workdir" \
        --output "$output" --jobs "$jobs" --python "$python_cmd"
}

# Clone REPO at REV into DIR, or reuse DIR when it is already checked out at REV.
checkout() {
    local repo=$1 rev=$2 dir=$3 head wanted
    if [[ -d $dir/.git ]]; then
        if [[ $dry_run == 0 ]]; then
            head=$(git -C "$dir" rev-parse HEAD)
            wanted=$(git -C "$dir" rev-parse --verify --quiet "$rev^{commit}") || wanted=
            [[ $head == "$wanted" ]] || die "$dir is not checked out at $rev; remove it or pass another --workdir"
        fi
        echo "reusing $dir (at $rev)"
        return 0
    fi
    run git clone --branch "$rev" --depth 1 --recurse-submodules --shallow-submodules "$repo" "$dir"
}

# The one wheel NAME-VERSION-cpXY-cpXY-*.whl in DIR; in a dry run, its pattern.
built_wheel() {
    local dir=$1 name=$2 version=$3 matches present
    local pattern="$name-$version-$PYTHON_TAG-$PYTHON_TAG-*.whl"
    if [[ $dry_run == 1 ]]; then
        printf '%s/%s\n' "$dir" "$pattern"
        return 0
    fi
    shopt -s nullglob
    # shellcheck disable=SC2206 # the pattern is meant to glob; versions and tags contain no spaces
    matches=("$dir"/$pattern)
    present=("$dir"/*.whl)
    shopt -u nullglob
    if [[ ${#matches[@]} != 1 ]]; then
        die "expected one $pattern in $dir, found ${#matches[@]} (wheels there: ${present[*]:-none})"
    fi
    printf '%s\n' "${matches[0]}"
}

# Fail unless the ABI checker (xla_images/abi) reports this build's ABI for WHEEL.
check_abi() {
    local wheel=$1 report found
    printf '+ %q %q inspect --json %q  # must report abi %s\n' "$abi_python" "$ABI_TOOL" "$wheel" "$ABI"
    if [[ $dry_run == 1 ]]; then
        return 0
    fi
    report=$("$abi_python" "$ABI_TOOL" inspect --json "$wheel") || die "the ABI check could not read $wheel"
    found=$(printf '%s' "$report" | "$abi_python" -c 'import json, sys; print(json.load(sys.stdin)["abi"])') ||
        die "the ABI check printed no abi for $wheel"
    if [[ $found != "$ABI" ]]; then
        die "$(basename "$wheel") uses the '$found' ABI, not '$ABI': the build did not honour _GLIBCXX_USE_CXX11_ABI=$ABI_FLAG. Nothing was copied to $output."
    fi
    echo "$(basename "$wheel"): abi $found, as wanted"
}

build_here() {
    local torch_wheel xla_wheel
    step "1/7 sources: pytorch $PYTORCH_REV, xla $XLA_REV"
    run mkdir -p "$workdir"
    checkout "$PYTORCH_REPO" "$PYTORCH_REV" "$pytorch_src"
    checkout "$XLA_REPO" "$XLA_REV" "$xla_src"

    step "2/7 build venv and build requirements"
    if [[ ! -x $py ]]; then
        run "$python_cmd" -m venv "$venv"
    fi
    run "$py" -m pip install -r "$pytorch_src/requirements.txt" wheel

    step "3/7 torch wheel"
    run_in "$pytorch_src" env _GLIBCXX_USE_CXX11_ABI="$ABI_FLAG" USE_CUDA=0 BUILD_TEST=0 \
        PYTORCH_BUILD_VERSION="$TORCH_VERSION" PYTORCH_BUILD_NUMBER=1 MAX_JOBS="$jobs" \
        "$py" setup.py bdist_wheel
    torch_wheel=$(built_wheel "$pytorch_src/dist" torch "$TORCH_VERSION")

    step "4/7 install it: torch_xla builds against the torch installed in the build venv"
    run "$py" -m pip install --no-deps --force-reinstall "$torch_wheel"

    step "5/7 torch_xla wheel"
    write_file "$xla_src/.bazelrc.user" "build --cxxopt=-D_GLIBCXX_USE_CXX11_ABI=$ABI_FLAG
build --host_cxxopt=-D_GLIBCXX_USE_CXX11_ABI=$ABI_FLAG"
    run_in "$xla_src" env CXX_ABI="$ABI_FLAG" _GLIBCXX_USE_CXX11_ABI="$ABI_FLAG" BUILD_CPP_TESTS=0 \
        TPUVM_MODE=1 BUNDLE_LIBTPU=0 TORCH_XLA_VERSION="$TORCH_XLA_VERSION_WANTED" \
        GIT_VERSIONED_XLA_BUILD=false BAZEL_JOBS="$jobs" \
        "$py" setup.py bdist_wheel
    xla_wheel=$(built_wheel "$xla_src/dist" torch_xla "$TORCH_XLA_VERSION_WANTED")

    step "6/7 check the ABI of both wheels"
    check_abi "$torch_wheel"
    check_abi "$xla_wheel"

    step "7/7 copy them to the wheelhouse"
    run mkdir -p "$output"
    run cp -f "$torch_wheel" "$xla_wheel" "$output/"
}

main() {
    step "$WHEEL_BUILD: torch $TORCH_VERSION + torch_xla $TORCH_XLA_VERSION_WANTED, $ABI ABI (_GLIBCXX_USE_CXX11_ABI=$ABI_FLAG), python $PYTHON_VERSION, for $FLAVOURS"
    preflight
    if [[ $host == 0 ]]; then
        in_builder
        if [[ $dry_run == 0 ]]; then
            return 0  # the run inside the builder printed the rest
        fi
        step "inside the builder image, the same script with --host:"
    fi
    build_here
    step "done. Next: ./build.py lock $FLAVOURS && ./build.py build $FLAVOURS"
}

main
