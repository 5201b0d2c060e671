/* Registers pair_style matris with LAMMPS (see lammpsplugin.h). */
#include "lammpsplugin.h"
#include "pair_matris.h"

using namespace LAMMPS_NS;

static Pair *matris_creator(LAMMPS *lmp)
{
  return new PairMatris(lmp);
}

extern "C" void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{
  lammpsplugin_t plugin;
  auto register_plugin = (lammpsplugin_regfunc) regfunc;
  plugin.version = MATRIS_LAMMPS_VERSION;    // the version string of the lmp it was built for
  plugin.style = "pair";
  plugin.name = "matris";
  plugin.info = "MatRIS universal interatomic potential (matris Python package)";
  plugin.author = "matris developers";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &matris_creator;
  plugin.handle = handle;
  (*register_plugin)(&plugin, lmp);
}
