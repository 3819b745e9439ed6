"""Consumers of capscope, built against it as its users would (issue 32, item 4): installed into a
temporary prefix, then found by CMake (find_package(capscope 0.3), target capscope::capscope; a
too-new request must be refused), by pkg-config, and used as a Meson subproject. Each consumer
compiles tests/consumers/consumer.cpp and runs it.

usage: run.py SOURCE_ROOT BUILD_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(cmd, cwd=None, env=None, expect_ok=True):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if (p.returncode == 0) != expect_ok:
        sys.exit(f"{'failed' if expect_ok else 'unexpectedly succeeded'}: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def main():
    source, build = (os.path.abspath(a) for a in sys.argv[1:3])
    here = os.path.join(source, "tests", "consumers")
    with tempfile.TemporaryDirectory() as tmp:
        stage = os.path.join(tmp, "stage")
        run(["meson", "install", "-C", build, "--no-rebuild", "--destdir", stage])
        options = json.loads(subprocess.run(["meson", "introspect", "--buildoptions", build], capture_output=True, text=True, check=True).stdout)
        prefix = stage + next(o["value"] for o in options if o["name"] == "prefix")

        # CMake: find_package(capscope 0.3), and a request for a version newer than this one refused.
        out = os.path.join(tmp, "cmake")
        run(["cmake", "-S", os.path.join(here, "cmake"), "-B", out, f"-DCMAKE_PREFIX_PATH={prefix}"])
        run(["cmake", "--build", out])
        print(run([os.path.join(out, "consumer")]).strip(), "(CMake)")
        newer = run(["cmake", "-S", os.path.join(here, "cmake"), "-B", os.path.join(tmp, "cmake-new"), f"-DCMAKE_PREFIX_PATH={prefix}",
                     "-DCAPSCOPE_REQUEST=9.0"], expect_ok=False)
        if "compatible with requested version" not in newer or "0.3.0" not in newer:
            sys.exit("a too-new find_package(capscope 9.0) was refused without saying which version is installed:\n" + newer)
        print("find_package(capscope 9.0): refused, naming the installed version")
        # 0.x: a minor bump may break, so a request for 0.2 is refused too; no version asked: found.
        older = run(["cmake", "-S", os.path.join(here, "cmake"), "-B", os.path.join(tmp, "cmake-old"), f"-DCMAKE_PREFIX_PATH={prefix}",
                     "-DCAPSCOPE_REQUEST=0.2"], expect_ok=False)
        if "compatible with requested version" not in older:
            sys.exit("find_package(capscope 0.2) against 0.3 was not refused as incompatible:\n" + older)
        run(["cmake", "-S", os.path.join(here, "cmake"), "-B", os.path.join(tmp, "cmake-any"), f"-DCMAKE_PREFIX_PATH={prefix}",
             "-DCAPSCOPE_REQUEST="])
        print("find_package(capscope 0.2): refused (0.x minor versions may break); find_package(capscope): found")

        # pkg-config: the .pc file's flags compile it (the staged install seen through a sysroot).
        pc_dir = os.path.join(prefix, "share", "pkgconfig")
        env = dict(os.environ, PKG_CONFIG_PATH=pc_dir, PKG_CONFIG_SYSROOT_DIR=stage)
        flags = run(["pkg-config", "--cflags", "capscope"], env=env).split()
        exe = os.path.join(tmp, "pkg-consumer")
        run(["c++", "-std=c++20", *flags, os.path.join(here, "consumer.cpp"), "-o", exe])
        print(run([exe]).strip(), "(pkg-config)")

        # Meson: capscope as a subproject.
        project = os.path.join(tmp, "meson-consumer")
        shutil.copytree(os.path.join(here, "meson"), project)
        shutil.copy(os.path.join(here, "consumer.cpp"), tmp)  # the project names ../consumer.cpp
        os.makedirs(os.path.join(project, "subprojects"))
        os.symlink(source, os.path.join(project, "subprojects", "capscope"))
        run(["meson", "setup", os.path.join(project, "build"), project])
        run(["meson", "compile", "-C", os.path.join(project, "build")])
        print(run([os.path.join(project, "build", "consumer")]).strip(), "(Meson subproject)")


if __name__ == "__main__":
    main()
