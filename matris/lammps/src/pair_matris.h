/* pair_style matris: MatRIS energies, forces and virials for LAMMPS.

   mode domain (the default on several ranks): every MPI rank evaluates the model for its own atoms, through an
   embedded Python interpreter (matris.lammps.runtime, matris.domain), with LAMMPS's ghost atoms
   (one bond deep: the default ghost cutoff). Inside every interaction block the ranks exchange
   what the block reads from other ranks (the line-graph sums of bonds that cross ranks, the ghost
   atoms' features) through LAMMPS's own communication: forward_comm and, in the force pass,
   reverse_comm of this pair style, by chunks of comm_forward doubles per atom. Forces on ghost
   atoms go back to their owners through LAMMPS's newton_pair reverse communication.

   mode gather: the positions and types of all atoms are gathered on MPI rank 0, which evaluates
   the whole periodic system; forces, per-atom energies and per-atom virials are scattered back.
   The default on one rank (the whole cell, no exchanges); on several, for small systems. */
#ifndef MATRIS_PAIR_MATRIS_H
#define MATRIS_PAIR_MATRIS_H

#include "pair.h"

#include <string>
#include <vector>

namespace LAMMPS_NS {

class PairMatris : public Pair {
 public:
  PairMatris(class LAMMPS *);
  ~PairMatris() override;
  void compute(int, int) override;
  void settings(int, char **) override;
  void coeff(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;
  // matris.domain's exchanges: rows [nlocal + nghost, width] of buf, owner -> ghost copies
  // (reverse 0) or ghost copies summed into owners (reverse 1); a sum or maximum over all ranks
  void exchange(int reverse, double *buf, int width);
  void allreduce(double *values, int n, int max);

 protected:
  std::string model_, device_ = "auto", dtype_ = "float32";  // matris's defaults everywhere
  std::vector<std::string> type_elements_;
  double cutoff_ = 0.0;
  int threads_ = 0;    // the model's threads per rank; 0: the rank's share of its cores
  std::string memory_limit_ = "auto";    // per rank: a size such as 8GB, or auto
  std::string stats_;    // PREFIX: each rank writes its counters to PREFIX.<rank>.json
  std::string mode_ = "auto";    // auto: domain on several ranks, gather on one
  bool gather_ = false;    // rank 0 evaluates the whole system (mode gather, or auto on one rank)
  void *evaluator_ = nullptr;    // PyObject* of matris.lammps.runtime.LammpsEvaluator (rank 0 only in mode gather)
  double *comm_buf_ = nullptr;    // the exchange in progress: its rows, width and column range
  int comm_width_ = 0, comm_col0_ = 0, comm_cols_ = 0;
  std::vector<double> all_x_, all_f_, all_e_, all_v_;
  std::vector<int> all_type_;
  void allocate();
  void load_model();
  void compute_gather(int, int);
  void compute_domain(int, int);
};

}    // namespace LAMMPS_NS

#endif
