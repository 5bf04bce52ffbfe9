#!/usr/bin/python3
"""libtaiji.so's ABI against the committed baseline (capi/abi/libtaiji.abi), with libabigail.

  abi_check.py dump LIB OUT        writes LIB's ABI as abixml (what the baseline holds)
  abi_check.py check BASELINE LIB  fails on an incompatible change of LIB from BASELINE
  abi_check.py selftest BASELINE   the check against changed copies of BASELINE: the
                                   compatible ones must pass, the others must fail

Compatible: added functions, each under a version node that BASELINE does not have, and
members appended to the config structs (capi/abi/libtaiji.supp says which). Everything
else abidiff reports fails: a removed function, a changed signature, a changed layout.
After an intended change (a new version node, an appended member), write the new baseline
with scripts/abi-baseline.sh and commit it with the change.
"""
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLIC_TYPES = os.path.join(ROOT, 'capi', 'abi', 'public-types.supp')
COMPATIBLE = os.path.join(ROOT, 'capi', 'abi', 'libtaiji.supp')


def tool(name):
    path = shutil.which(name)
    if path is None:
        # Not a skip: a check that quietly does not run passes every change.
        sys.exit(f'abi_check: {name} not found; install abigail-tools (scripts/setup.sh does)')
    return path


def dump(lib, out):
    # The public-types suppression drops at read time, which only the ELF reader can do.
    text = subprocess.run([tool('abidw'), '--no-corpus-path', '--suppressions', PUBLIC_TYPES, lib],
                          check=True, capture_output=True, text=True).stdout
    # The build directory a compiler ran in (ccache may replay another's) is no part of the ABI.
    root = ET.fromstring(text)
    if root.find('.//function-decl') is None:
        sys.exit(f'abi_check: {lib} has no debug information (abidw needs it: build with debug=true)')
    for instr in root.iter('abi-instr'):
        instr.attrib.pop('comp-dir-path', None)
    ET.ElementTree(root).write(out, encoding='unicode')


def symbols(corpus):
    return {s.get('name'): s.get('version') for s in ET.parse(corpus).getroot().iter('elf-symbol')}


def compare(baseline, candidate):
    """abidiff's report and whether candidate is compatible with baseline."""
    # Added symbols are judged below, by their version node.
    run = subprocess.run([tool('abidiff'), '--no-added-syms', '--suppressions', COMPATIBLE,
                          baseline, candidate], capture_output=True, text=True)
    report = run.stdout + run.stderr
    ok = run.returncode == 0
    old, new = symbols(baseline), symbols(candidate)
    old_nodes = set(old.values())
    for name in sorted(set(new) - set(old)):
        if new[name] in old_nodes:
            ok = False
            report += f'added symbol {name} is in the released version node {new[name]}\n'
    return ok, report


def check(baseline, lib):
    with tempfile.TemporaryDirectory() as tmp:
        current = os.path.join(tmp, 'libtaiji.abi')
        dump(lib, current)
        ok, report = compare(baseline, current)
    print(report)
    if not ok:
        sys.exit('abi_check: incompatible ABI change (see above); if it is compatible and intended, '
                 'regenerate the baseline: scripts/abi-baseline.sh')
    print('abi_check: compatible with the baseline')


# Each change of the baseline that selftest makes, and whether the check must accept it.
def public_struct(root, name):
    return next(e for e in root.iter('class-decl')
                if e.get('name') == name and e.get('is-declaration-only') != 'yes')


def function(root, name):
    return next(e for e in root.iter('function-decl') if e.get('name') == name)


def add_member(root, at_end):
    """A pointer member in taiji_config_t: at its end, or after struct_size."""
    s = public_struct(root, 'taiji_config')
    members = s.findall('data-member')
    pointer = next(m for m in members if m.find('var-decl').get('name') == 'rendezvous')
    new = copy.deepcopy(pointer)
    new.find('var-decl').set('name', 'added')
    size = int(s.get('size-in-bits'))
    bits = 64
    if at_end:
        new.set('layout-offset-in-bits', str(size))
        s.append(new)
    else:
        new.set('layout-offset-in-bits', members[1].get('layout-offset-in-bits'))
        for m in members[1:]:
            m.set('layout-offset-in-bits', str(int(m.get('layout-offset-in-bits')) + bits))
        s.insert(list(s).index(members[1]), new)
    s.set('size-in-bits', str(size + bits))


def add_function(root, node):
    """A copy of taiji_version() named taiji_abi_added under version node `node`."""
    symbol = next(e for e in root.iter('elf-symbol') if e.get('name') == 'taiji_version')
    parent = next(p for p in root.iter() if symbol in list(p))
    new_symbol = copy.deepcopy(symbol)
    new_symbol.set('name', 'taiji_abi_added')
    new_symbol.set('version', node)
    parent.append(new_symbol)
    decl = function(root, 'taiji_version')
    parent = next(p for p in root.iter() if decl in list(p))
    new_decl = copy.deepcopy(decl)
    for attr in ('name', 'mangled-name'):
        new_decl.set(attr, 'taiji_abi_added')
    new_decl.set('elf-symbol-id', f'taiji_abi_added@@{node}')
    parent.append(new_decl)


def remove_function(root, name):
    for tag, key in (('elf-symbol', 'name'), ('function-decl', 'name')):
        for parent in root.iter():
            for e in list(parent):
                if e.tag == tag and e.get(key) == name:
                    parent.remove(e)


def change_parameter(root):
    """taiji_barrier's options parameter becomes an int."""
    int_id = next(e.get('id') for e in root.iter('type-decl') if e.get('name') == 'int')
    params = function(root, 'taiji_barrier').findall('parameter')
    params[-1].set('type-id', int_id)


CASES = [
    ('a member appended to taiji_config_t', True, lambda r: add_member(r, at_end=True)),
    ('a function added under a new version node', True, lambda r: add_function(r, 'TAIJI_ABI_NEW')),
    ('a member inserted in the middle of taiji_config_t', False, lambda r: add_member(r, at_end=False)),
    ('a function added to a released version node', False, lambda r: add_function(r, 'TAIJI_0')),
    ('taiji_barrier removed', False, lambda r: remove_function(r, 'taiji_barrier')),
    ("taiji_barrier's last parameter changed", False, change_parameter),
]


def selftest(baseline):
    wrong = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (what, compatible, change) in enumerate(CASES):
            tree = ET.parse(baseline)
            change(tree.getroot())
            changed = os.path.join(tmp, f'case{i}.abi')
            tree.write(changed, encoding='unicode')
            ok, report = compare(baseline, changed)
            verdict = 'passes' if ok else 'fails'
            print(f'--- {what}: {verdict}\n{report}')
            if ok != compatible:
                wrong.append(what)
    if wrong:
        sys.exit('abi_check: the check judged wrongly: ' + '; '.join(wrong))
    print(f'abi_check: all {len(CASES)} changes judged right')


def main(argv):
    commands = {'dump': (dump, 2), 'check': (check, 2), 'selftest': (selftest, 1)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        sys.exit(__doc__)
    commands[argv[1]][0](*argv[2:])


if __name__ == '__main__':
    main(sys.argv)
