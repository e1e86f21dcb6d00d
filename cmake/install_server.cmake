# Run by `cmake --install` (install(SCRIPT) in server/CMakeLists.txt), so that
# CMAKE_INSTALL_PREFIX is the prefix of this install, `--prefix P` included:
# installs paradevd's configuration, the Slurm scripts, the systemd unit and
# the sysusers file, every one under that prefix, except that the
# configuration follows GNUInstallDirs' rule for CMAKE_INSTALL_FULL_SYSCONFDIR
# (prefix / or /usr: /etc; /opt/NAME: /etc/opt/NAME; otherwise PREFIX/etc).
# The unit is written from deploy/systemd/paradevd.service.in with the paths
# this install used, so its ExecStart= and --config name what was installed.
# DESTDIR is honoured (file(INSTALL) prepends it).
#
# Set by server/CMakeLists.txt: PARADEV_SOURCE_DIR, PARADEV_BINARY_DIR, and
# GNUInstallDirs' (usually relative) PARADEV_SYSCONFDIR, PARADEV_SBINDIR,
# PARADEV_DOCDIR; PARADEV_BUILT_CONFIG, paradevd's built-in --config default.

function(_pd_under_prefix out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${_pd_prefix}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

string(REGEX REPLACE "(.)/+$" "\\1" _pd_prefix "${CMAKE_INSTALL_PREFIX}")
if(IS_ABSOLUTE "${PARADEV_SYSCONFDIR}")
  set(_pd_sysconf "${PARADEV_SYSCONFDIR}")
elseif(_pd_prefix STREQUAL "/" OR _pd_prefix STREQUAL "/usr")
  set(_pd_sysconf "/etc")
elseif(_pd_prefix MATCHES "^/opt/(.*)")
  set(_pd_sysconf "/etc/opt/${CMAKE_MATCH_1}")
else()
  set(_pd_sysconf "${_pd_prefix}/${PARADEV_SYSCONFDIR}")
endif()
_pd_under_prefix(_pd_sbindir "${PARADEV_SBINDIR}")
_pd_under_prefix(PARADEV_DOCDIR "${PARADEV_DOCDIR}")
set(PARADEVD "${_pd_sbindir}/paradevd")
set(PARADEV_CONFIG "${_pd_sysconf}/paradev/paradevd.conf")

file(INSTALL DESTINATION "${_pd_sysconf}/paradev" TYPE FILE
     FILES "${PARADEV_SOURCE_DIR}/deploy/paradevd.conf")
file(INSTALL DESTINATION "${_pd_sysconf}/paradev/slurm" TYPE PROGRAM
     FILES "${PARADEV_SOURCE_DIR}/deploy/slurm/prolog.sh"
           "${PARADEV_SOURCE_DIR}/deploy/slurm/epilog.sh"
           "${PARADEV_SOURCE_DIR}/deploy/slurm/task_prolog.sh")

# The unit, filled in with this install's paths. Written directly (not
# staged in the build tree, which the installing user may not own).
file(READ "${PARADEV_SOURCE_DIR}/deploy/systemd/paradevd.service.in" _pd_unit)
string(CONFIGURE "${_pd_unit}" _pd_unit @ONLY)
set(_pd_unit_file "${_pd_prefix}/lib/systemd/system/paradevd.service")
message(STATUS "Installing: $ENV{DESTDIR}${_pd_unit_file}")
file(WRITE "$ENV{DESTDIR}${_pd_unit_file}" "${_pd_unit}")
list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${_pd_unit_file}")  # as file(INSTALL) records: without DESTDIR
file(INSTALL DESTINATION "${_pd_prefix}/lib/sysusers.d" TYPE FILE
     RENAME paradev.conf FILES "${PARADEV_SOURCE_DIR}/deploy/systemd/paradevd.sysusers")

if(NOT PARADEV_CONFIG STREQUAL PARADEV_BUILT_CONFIG)
  message(STATUS "paradevd: configuration installed as ${PARADEV_CONFIG}, but the "
          "daemon was built for ${PARADEV_BUILT_CONFIG} (its default --config): the "
          "installed unit passes --config ${PARADEV_CONFIG}; run paradevd by hand the "
          "same way, or configure with -DCMAKE_INSTALL_PREFIX=${_pd_prefix}")
endif()
