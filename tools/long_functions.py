#!/usr/bin/env python3
"""Lists the project's C++/CUDA functions longer than a limit, longest first (issue 28's "split
every function over about 120 lines").

  tools/long_functions.py              functions over 120 lines in the project's source folders
  tools/long_functions.py 100 core sim functions over 100 lines in core/ and sim/ only
  tools/long_functions.py --help       this text

A function's length runs from its first line to its closing brace, as universal-ctags (Debian's
universal-ctags package) finds them in the tracked .h/.cc/.cu/.cuh files; lambdas are not counted
on their own. Prints `lines  file:line  scope::name`.
"""
import json
import shutil
import subprocess
import sys

DEFAULT_FOLDERS = ['core', 'sim', 'cuda_backend', 'capi', 'tools', 'store', 'bootstrap', 'npy']


def main():
    args = sys.argv[1:]
    if args and args[0] in ('-h', '--help'):
        print(__doc__.strip())
        return
    limit = int(args.pop(0)) if args and args[0].isdigit() else 120
    folders = args or DEFAULT_FOLDERS
    if shutil.which('ctags') is None:
        sys.exit('tools/long_functions.py: ctags is missing (apt-get install universal-ctags)')
    files = subprocess.run(['git', 'ls-files', '--'] + [f'{d}/*.{e}' for d in folders for e in ('h', 'cc', 'cu', 'cuh')],
                           capture_output=True, text=True, check=True).stdout.split()
    if not files:
        sys.exit(f"tools/long_functions.py: no tracked .h/.cc/.cu/.cuh files in {' '.join(folders)}")
    tags = subprocess.run(['ctags', '--output-format=json', '--fields=+nes', '--c++-kinds=f', '--languages=C++',
                           '--map-C++=+.cu', '--map-C++=+.cuh', '-f', '-'] + files,
                          capture_output=True, text=True, check=True).stdout
    rows = []
    for line in tags.splitlines():
        tag = json.loads(line)
        if tag.get('kind') != 'function' or 'end' not in tag or tag['name'].startswith('__anon'):
            continue
        length = tag['end'] - tag['line'] + 1
        if length > limit:
            scope = [part for part in tag.get('scope', '').split('::') if part and not part.startswith('__anon')]
            name = '::'.join(scope + [tag['name']])
            rows.append((length, f"{tag['path']}:{tag['line']}", name))
    for length, where, name in sorted(rows, reverse=True):
        print(f'{length:5d}  {where:55s} {name}')


if __name__ == '__main__':
    main()
