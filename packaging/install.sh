#!/bin/sh
# Install the Brisk bundle for this user: the app in ~/.local/lib/brisk, the `brisk` command in
# ~/.local/bin, the desktop entry and icon where menus find them.  Run it from the unpacked tarball:
#   tar xzf brisk-*.tar.gz && cd brisk-* 2>/dev/null; ./install.sh
# Your chats, settings and converted models stay in your usual data folders, shared with a source install.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${PREFIX:-$HOME/.local}
mkdir -p "$prefix/lib" "$prefix/bin" "$prefix/share/applications" "$prefix/share/icons/hicolor/scalable/apps"
rm -rf "$prefix/lib/brisk.new"
cp -R "$here/brisk" "$prefix/lib/brisk.new"
rm -rf "$prefix/lib/brisk"
mv "$prefix/lib/brisk.new" "$prefix/lib/brisk"
ln -sf "$prefix/lib/brisk/brisk" "$prefix/bin/brisk"
sed "s|^Exec=.*|Exec=$prefix/lib/brisk/brisk|" "$here/brisk.desktop" > "$prefix/share/applications/brisk.desktop"
cp "$here/brisk.svg" "$prefix/share/icons/hicolor/scalable/apps/brisk.svg"
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$prefix/share/applications" || true
echo "Brisk is installed: run 'brisk' (in $prefix/bin), or find it in your applications menu."
