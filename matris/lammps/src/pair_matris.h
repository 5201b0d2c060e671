/* pair_style matris: MatRIS energies, forces and virials for LAMMPS.

   Every step the positions and types of all atoms are gathered on MPI rank 0, which
   evaluates the model on the whole periodic system through an embedded Python interpreter
   (matris.lammps.runtime); forces, per-atom energies and per-atom virials are then
   broadcast and each rank keeps those of its own atoms. The result is the same for any
   number of ranks and needs no ghost atoms beyond LAMMPS's default. */
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

 protected:
  std::string model_, device_ = "auto", dtype_ = "float32";  // matris's defaults everywhere
  std::vector<std::string> type_elements_;
  double cutoff_ = 0.0;
  int threads_ = 0;    // rank 0's model threads; 0: the cores rank 0 may run on
  void *evaluator_ = nullptr;    // PyObject* of matris.lammps.runtime.LammpsEvaluator, rank 0 only
  std::vector<double> all_x_, all_f_, all_e_, all_v_;
  std::vector<int> all_type_;
  void allocate();
  void load_model();
};

}    // namespace LAMMPS_NS

#endif
