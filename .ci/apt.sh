# Sourced by the .ci/*-deps.sh scripts: `apt_install PACKAGE...` installs Debian packages,
# refreshing the package lists first, without recommends. Root installs directly (CI runs as
# root); anyone else goes through sudo.
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
fi

apt_install() {
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends "$@"
}
