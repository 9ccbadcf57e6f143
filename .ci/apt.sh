# Sourced by the .ci/*-deps.sh scripts. It gives them:
#   have TOOL           whether TOOL is installed, looked for in /usr/sbin and /sbin too
#   apt_install PKG...  installs Debian packages (lists refreshed first, no recommends) as root,
#                       or through sudo where sudo can ask; returns 1 where nobody can install
#   not_installed NAME WHAT PKG...
#                       says what is missing and how an administrator installs it; exits 0 so
#                       that pytest runs (the tests that need it skip, each with its reason),
#                       or 1 under CI, which must prove every test (tests/skips.py)
# An ordinary user's PATH on Debian has no /usr/sbin or /sbin, where useradd, dockerd and ip
# live: without them here a tool that is installed would look missing.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac
case ":$PATH:" in *:/sbin:*) ;; *) PATH="$PATH:/sbin" ;; esac
export PATH

have() {
    command -v "$1" >/dev/null 2>&1
}

in_ci() {
    case "$(printf '%s' "${CI:-}" | tr '[:upper:]' '[:lower:]')" in
        "" | 0 | false | no) return 1 ;;
        *) return 0 ;;
    esac
}

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
fi

# Root installs directly (CI runs as root). Anyone else through sudo, where it answers without
# a password or a terminal can ask for one; without either there is nobody to install.
may_install() {
    [ "$(id -u)" -eq 0 ] && return 0
    have sudo || return 1
    sudo -n true 2>/dev/null && return 0
    [ -t 0 ]
}

apt_install() {
    may_install || return 1
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends "$@"
}

not_installed() {
    local name="$1" what="$2"
    shift 2
    echo "$name: missing: $what. Not installed: this user is not root and has no sudo." >&2
    echo "$name: an administrator installs them with: apt-get install --no-install-recommends $*" >&2
    if in_ci; then
        echo "$name: CI proves every test, so this fails the run" >&2
        exit 1
    fi
    echo "$name: the tests that need them skip, each saying why" >&2
    exit 0
}
