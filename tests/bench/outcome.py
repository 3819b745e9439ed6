"""What the bench scripts' tests share: running a script as a user would, and ending with each
failure and one line of verdict."""
import subprocess
import sys


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(failed, passed):
    """Prints each failure, then `passed` or how many failed; exits 1 if any did."""
    for f in failed:
        print("FAIL", f)
    print(passed if not failed else f"{len(failed)} failed")
    sys.exit(1 if failed else 0)
