// Under `mpirun -np 2`, no GPU needed: one rank fails while the other waits for it in a
// collective. capscope must end both within seconds, naming the failing rank, never hang.
//
//   rank_failure_probe none     every rank meets the all-reduce: exit 0
//   rank_failure_probe throw    rank 1 throws inside run_ranks: "rank 1 of 2 failed: ..."
//   rank_failure_probe scope    rank 1 throws out of an mpi_session's scope, caught further out

#include <capscope/parallel/mpi_bootstrap.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace {

void meet(const capscope::cuda::mpi_session& mpi, const std::string& fault) {
    if (fault != "none" && mpi.rank() == 1) throw std::runtime_error("injected fault on rank 1, before the all-reduce");
    int mine = mpi.rank() + 1, sum = 0; // rank 0 waits here for rank 1
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (sum != mpi.size() * (mpi.size() + 1) / 2) throw std::runtime_error("wrong sum " + std::to_string(sum));
}

} // namespace

int main(int argc, char** argv) {
    const std::string fault = argc > 1 ? argv[1] : "none";
    if (fault != "none" && fault != "throw" && fault != "scope") {
        std::fprintf(stderr, "usage: rank_failure_probe [none|throw|scope]\n");
        return 2;
    }
    if (fault != "scope") return capscope::cuda::run_ranks([&](capscope::cuda::mpi_session& mpi) { meet(mpi, fault); });
    try {
        capscope::cuda::mpi_session mpi;
        meet(mpi, fault);
    } catch (const std::exception& e) { // too late to help the other rank: the session's destructor has acted
        std::fprintf(stderr, "caught outside the session: %s\n", e.what());
        return 1;
    }
    return 0;
}
